"""Scenario 3: failover, for real and simulated.

Real: a streaming standby made with ``pg_basebackup`` from the private primary, with
synchronous replication, so a commit the primary acknowledged is on both servers.
Workers and the API use one multi-host connection string with
``target_session_attrs=read-write``. Under load the primary is stopped with
``-m immediate`` and the standby promoted: both resume on the new primary without a
restart, and no acknowledged enqueue or ack is lost.

Simulated: the primary turns read-only (``ALTER SYSTEM SET
default_transaction_read_only = on`` and a reload), as an operator fences a server.
Workers keep their outcomes and back off, the API answers 503 to writes and keeps
serving reads, and both resume once writes are allowed again.
"""

from __future__ import annotations

import time
from pathlib import Path

import fault_sql
import httpx
from fault_support import SCHEMA, FaultRun, database_now, send_via_api, serve_api
from polling import wait_for

from pgqueue_api import ApiSettings
from pgqueue_bench.infra.servers import LOOPBACK, SUPERUSER

READ_ONLY_SECONDS = 2.0


def test_failover_to_a_synchronous_standby_loses_no_acknowledged_enqueue_or_ack(
    start_server, record_figures, tmp_path: Path
) -> None:
    primary = start_server()
    standby = primary.create_standby()
    try:
        primary.configure(synchronous_standby_names="*")
        wait_for(
            lambda: [
                row
                for row in fault_sql.run(primary.url(), "replication_sync_states")
                if row["sync_state"] == "sync"
            ],
            what="the standby to replicate synchronously",
        )
        both = (
            f"postgresql://{SUPERUSER}@{LOOPBACK}:{primary.port},{LOOPBACK}:{standby.port}"
            "/postgres?target_session_attrs=read-write"
        )
        settings = ApiSettings(database_url=both, schema=SCHEMA, pool_timeout=2.0)
        with FaultRun.prepared(both, tmp_path) as run, serve_api(settings) as api:
            workers = run.start_workers(2)
            producer = run.produce(300, send=send_via_api(api), pause=0.03)
            run.wait_until_succeeded(60)

            primary.stop("immediate")
            stopped_at = database_now(standby.url())
            standby.promote()
            promoted_at = database_now(standby.url())

            run.wait_until_done()
            verdict = run.verdict()
            assert api.get("/healthz").status_code == 200
            logs = workers.logs()
        promoted = not fault_sql.run(standby.url(), "server_in_recovery")[0]["in_recovery"]
    finally:
        standby.destroy()

    assert promoted
    assert "database unavailable" in logs
    assert "database available again" in logs
    # Every ack a worker saw commit on the old primary is on the new one.
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 300}
    record_figures(
        "03-failover-to-standby",
        verdict.figures(
            recovery_seconds=verdict.recovery_seconds(promoted_at),
            promoted_after_seconds=round((promoted_at - stopped_at).total_seconds(), 3),
            api_refusals=len(producer.refusals),
        ),
    )


def test_a_primary_turned_read_only_pauses_writes_and_both_resume_without_loss(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    settings = ApiSettings(database_url=server.url(), schema=SCHEMA, pool_timeout=2.0)
    with FaultRun.prepared(server.url(), tmp_path) as run, serve_api(settings) as api:
        # Leases longer than the read-only spell: the heartbeat cannot write either.
        workers = run.start_workers(2, lease_seconds=10.0, heartbeat_seconds=1.0)
        run.produce(300, send=send_via_api(api), pause=0.03)
        run.wait_until_succeeded(60)

        server.set_read_only(True)
        # The reload reaches each session at its next command. Until the API's does, a
        # write still succeeds: an acknowledged enqueue like any other.
        accepted_after_reload: list[str] = []

        def refused_write() -> httpx.Response | None:
            key = f"read-only-{len(accepted_after_reload)}"
            response = api.post("/jobs", json={"task": "fault_work", "idempotency_key": key})
            if response.status_code == 201:
                run.acknowledge({key: response.json()["id"]})
                accepted_after_reload.append(key)
                return None
            return response

        write = wait_for(refused_write, what="the API to refuse a write")
        wait_for(lambda: "read-only transaction" in workers.logs(), what="a refused ack")
        refused_at = run.now()
        reads = [api.get(path).status_code for path in ("/jobs", "/queues", "/healthz")]
        time.sleep(READ_ONLY_SECONDS)  # how long the fault lasts, not a wait for anything
        writable_at = run.now()
        server.set_read_only(False)

        run.wait_until_done()
        verdict = run.verdict()
        logs = workers.logs()

    # Sessions pick the setting up at their next command, so a pooled connection idle
    # since the reload may still commit once: count what finished in the spell rather
    # than forbid it.
    finished_while_read_only = [at for at in verdict.finished_at if refused_at <= at <= writable_at]
    assert write.status_code == 503
    assert write.headers["retry-after"]
    assert write.json()["detail"] == "database unavailable; retry later"
    assert reads == [200, 200, 200]
    assert "database available again" in logs
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": verdict.jobs}
    record_figures(
        "03-read-only-primary",
        verdict.figures(
            recovery_seconds=verdict.recovery_seconds(writable_at),
            writes_accepted_after_the_reload=len(accepted_after_reload),
            jobs_finished_while_read_only=len(finished_while_read_only),
        ),
    )
