"""Scenario 12: PostgreSQL crashes (``pg_ctl stop -m immediate``) while producers post
to an API started with ``--reject-unserved-tasks``, and when it stops cleanly for longer
than the workers' rows last.

The worker registry is unlogged: crash recovery empties it, and a clean restart keeps
rows that expired while the server was down. Until every live worker has had time to
write its row again, the API cannot tell a task no worker serves from one whose workers
have not beaten yet, and must not answer 422 (a client does not send a 4xx again, so
the job would be lost at the producer). Once they have, a task no worker serves is
refused again.
"""

from __future__ import annotations

from pathlib import Path

from fault_support import SCHEMA, FaultRun, send_via_api, serve_api
from polling import wait_for

from pgqueue import Queue, WorkerProtocol, WorkerRegistration
from pgqueue_api import ApiSettings

JOBS = 300


def test_a_crash_with_reject_unserved_tasks_loses_no_job_to_a_false_422(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    url = server.url()
    settings = ApiSettings(database_url=url, schema=SCHEMA, reject_unserved_tasks=True)
    with FaultRun.prepared(url, tmp_path) as run, serve_api(settings) as api:
        run.start_workers(2)
        # The check is on: a task no worker serves is refused, before the crash.
        assert api.post("/jobs", json={"task": "nobody_serves_this"}).status_code == 422
        producer = run.produce(
            JOBS, send=send_via_api(api, rejections_lose_jobs=True), batch=4, pause=0.01
        )
        run.wait_until_succeeded(40)

        server.stop("immediate")
        server.start()
        recovered_from = run.now()

        run.wait_until_done()
        verdict = run.verdict()
        # Once every live worker could write its row again, the check is back.
        wait_for(
            lambda: api.post("/jobs", json={"task": "nobody_serves_this"}).status_code == 422,
            90,
            interval=1.0,
            what="a task no worker serves to be refused again",
        )

    lost_at_producer = sorted(producer.rejected)
    assert lost_at_producer == [], {key: producer.rejected[key] for key in lost_at_producer[:3]}
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": JOBS}
    record_figures(
        "12-crash-reject-unserved",
        {
            **verdict.figures(
                recovery_seconds=verdict.recovery_seconds(recovered_from),
                producer_refusals=len(producer.refusals),
            ),
            "lost": len(verdict.lost) + len(lost_at_producer),
            "rejected_422": len(lost_at_producer),
            "stuck": sum(
                count for state, count in verdict.states.items() if state in ("queued", "running")
            ),
        },
    )


def test_rows_that_expired_during_a_clean_restart_do_not_make_tasks_unserved(
    start_server, tmp_path: Path
) -> None:
    """A fast shutdown keeps the unlogged registry, with rows that expire while the
    server is down: they say nothing about whether their workers are alive."""
    server = start_server()
    url = server.url()
    FaultRun.prepared(url, tmp_path).close()
    worker = WorkerRegistration(
        id="host:1:a", queues=["default"], tasks=["send"], concurrency=1, expiry_seconds=0.5
    )
    with Queue.connect(url, schema=SCHEMA, max_size=2) as queue:
        queue.register_worker(worker)
        assert queue.unserved_tasks([("default", "send"), ("default", "typo")]) == [
            ("default", "typo")
        ]
    server.stop("fast")
    server.start()
    with Queue.connect(url, schema=SCHEMA, max_size=2) as queue:
        wait_for(
            lambda: queue.workers() == [], 10, what="the registry row to expire after the start"
        )
        assert queue.unserved_tasks([("default", "send")]) == []
        # The worker is back: its next heartbeat writes its row again.
        WorkerProtocol(queue).heartbeat([], worker=worker)
        assert queue.unserved_tasks([("default", "send"), ("default", "typo")]) == []
