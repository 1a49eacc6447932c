"""Scenario 6: an exhausted connection pool, and a lock that hangs every statement.

Pool: the handlers use the application's pool for their own queries (as handlers that
share the app's pool do) and hold every connection past the job's lease. The claim loop
cannot get a connection and says so; the heartbeat, which has a connection of its own,
keeps every lease, so no job is reaped and run twice.

Lock: another session holds ``LOCK TABLE jobs`` (as a migration's ``ALTER TABLE`` does)
on a database with a ``statement_timeout``. The API's and the workers' statements time
out with clear errors (503 with ``Retry-After`` for producers), ``/healthz`` keeps
answering, and everything resumes once the lock is released.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import fault_sql
import psycopg
import psycopg_pool
import pytest
from fault_support import SCHEMA, FaultRun, prepare_schema, send_via_api, serve_api
from polling import wait_for

from pgqueue import DatabaseUnavailable, JobState, Queue
from pgqueue.connections import CONNECTION_DEFAULTS
from pgqueue_api import ApiSettings
from pgqueue_worker import Worker

HOLD_SECONDS = 3.0
LOCK_SECONDS = 4.0
STATEMENT_TIMEOUT = "2s"


def test_heartbeats_keep_every_lease_while_handlers_hold_the_whole_pool(
    start_server, record_figures, caplog
) -> None:
    server = start_server()
    url = server.url()
    prepare_schema(url)
    pool = psycopg_pool.ConnectionPool(
        url, kwargs=dict(CONNECTION_DEFAULTS), min_size=2, max_size=2, timeout=1.0, open=True
    )
    queue = Queue(pool, schema=SCHEMA)

    def report(payload: dict[str, Any]) -> dict[str, int]:
        # The handler's own query, on the application's pool, longer than the lease.
        with queue.pool.connection(timeout=60) as conn:
            conn.execute("SELECT pg_sleep(%s)", (HOLD_SECONDS,))
        return {"n": payload["n"]}

    def echo(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    # Two reports take both pooled connections; the echoes, done at once beside them,
    # leave acks that the claim loop cannot write until a connection comes back.
    jobs = [queue.enqueue("report", {"n": n}).job.id for n in range(2)]
    jobs += [queue.enqueue("echo", {"n": n}).job.id for n in range(10)]
    worker = Worker(
        queue,
        {"report": report, "echo": echo},
        concurrency=4,
        lease_seconds=1.0,
        heartbeat_seconds=0.2,
        poll_interval=0.2,
        reap_interval=0.2,
    )
    # The test watches through a pool of its own: the application's is the one held.
    with (
        caplog.at_level(logging.WARNING, logger="pgqueue.worker"),
        Queue.connect(url, schema=SCHEMA) as observer,
    ):
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            wait_for(
                lambda: all(observer.get(job_id).state is JobState.SUCCEEDED for job_id in jobs),
                what="every job to succeed",
            )
        finally:
            worker.stop()
            thread.join(60)
            queue.close()
        finished = [observer.get(job_id) for job_id in jobs]

    refusals = [
        r.getMessage() for r in caplog.records if "couldn't get a connection" in r.getMessage()
    ]
    # The claim loop was turned away by the busy pool, and said why...
    assert worker.counts["database_errors"] >= 1
    assert refusals
    # ...while the heartbeat's own connection kept every lease: one attempt per job.
    assert [job.attempts for job in finished] == [1] * 12
    assert worker.counts["succeeded"] == 12
    assert worker.counts["lost"] == 0
    record_figures(
        "06-pool-exhausted",
        {
            "jobs": len(jobs),
            "lost": 0,
            "duplicates": 0,
            "redeliveries": sum(job.attempts - 1 for job in finished),
            "claim_rounds_refused": worker.counts["database_errors"],
            "lease_seconds": 1.0,
            "pool_held_seconds": HOLD_SECONDS,
        },
    )


def test_a_hung_table_lock_times_out_with_clear_errors_and_loses_nothing(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    url = server.url()
    fault_sql.run(
        url,
        "database_setting_set",
        database="postgres",
        name="statement_timeout",
        value=fault_sql.sql.Literal(STATEMENT_TIMEOUT),
    )
    settings = ApiSettings(database_url=url, schema=SCHEMA, pool_timeout=2.0)
    with FaultRun.prepared(url, tmp_path) as run, serve_api(settings) as api:
        # Leases that outlast the lock: its victims are the statements, not the leases.
        workers = run.start_workers(2, lease_seconds=10.0, heartbeat_seconds=1.0)
        producer = run.produce(300, send=send_via_api(api), pause=0.03)
        run.wait_until_succeeded(60)

        with psycopg.connect(url) as holder:
            fault_sql.execute(holder, "session_without_timeouts")
            fault_sql.execute(holder, "jobs_lock_table", schema=SCHEMA)
            locked_at = run.now()
            blocked = api.post("/jobs", json={"task": "fault_work"})
            health = api.get("/healthz")
            with pytest.raises(DatabaseUnavailable) as in_process:
                run.queue.enqueue("fault_work", {})
            wait_for(lambda: "statement timeout" in workers.logs(), what="a worker's timeout")
            time.sleep(max(0.0, LOCK_SECONDS - (run.now() - locked_at).total_seconds()))
            holder.rollback()
        released_at = run.now()

        run.wait_until_done()
        verdict = run.verdict()
        logs = workers.logs()

    assert blocked.status_code == 503
    assert blocked.headers["retry-after"]
    assert health.status_code == 200
    # A library caller is told why; the API's 503 keeps the reason for its own log.
    assert str(in_process.value) == (
        "database unavailable: canceling statement due to statement timeout"
    )
    assert "database unavailable: canceling statement due to statement timeout" in logs
    assert "database available again" in logs
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 300}
    record_figures(
        "06-hung-table-lock",
        verdict.figures(
            recovery_seconds=verdict.recovery_seconds(released_at),
            lock_held_seconds=round((released_at - locked_at).total_seconds(), 3),
            statement_timeout=STATEMENT_TIMEOUT,
            api_refusals=len(producer.refusals),
        ),
    )
