"""Scenario 2: backends die under the workers.

A backend killed with ``kill -9`` makes the postmaster end every connection and run crash
recovery, as after a segfault. ``pg_terminate_backend`` ends one connection at a time:
the worker's pooled connection, its heartbeat's, and its LISTEN session. Jobs must still
be picked up (LISTEN comes back), leases must hold through a lost heartbeat connection,
and nothing acknowledged may be lost or acked twice.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import fault_sql
from fault_support import SCHEMA, FaultRun, work_jobs
from polling import wait_for

from pgqueue_worker import connections

# The worker here polls once an hour: a job it picks up within a test's timeout was
# brought to it by a notification.
NEVER_POLL = 3600.0


def test_a_backend_killed_with_sigkill_resets_every_connection_and_loses_nothing(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    with FaultRun.prepared(server.url(), tmp_path) as run:
        run.start_workers(2)
        run.produce(300, pause=0.03)
        run.wait_until_succeeded(60)

        victim = server.backend_pids(connections.MAIN)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: "reinitializing" in server.log_tail(200), what="the postmaster's reset")
        server.wait_accepting()
        recovered_from = run.now()

        run.wait_until_done()
        verdict = run.verdict()

    assert f"(PID {victim}) was terminated by signal 9" in server.log_tail(200)
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 300}
    record_figures(
        "02-backend-killed",
        verdict.figures(recovery_seconds=verdict.recovery_seconds(recovered_from)),
    )


def _listeners(url: str) -> list[int]:
    """Pids of the sessions LISTENing for the run's jobs."""
    listen = f'LISTEN "{SCHEMA}_jobs"'
    return [row["pid"] for row in fault_sql.run(url, "listening_backends", {"listen": listen})]


def test_terminated_connections_are_replaced_leases_hold_and_listen_comes_back(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    url = server.url()
    with FaultRun.prepared(url, tmp_path) as run:
        workers = run.start_workers(1, poll_interval=NEVER_POLL, lease_seconds=2.0)
        [first_listener] = wait_for(lambda: _listeners(url), what="the worker to LISTEN")

        # Four jobs that outlive their lease: only heartbeats keep them.
        long_jobs = run.enqueue(work_jobs(4, "long", ms=4000))
        wait_for(lambda: (run.counts() or {}).get("running") == 4, what="the long jobs to start")

        for role in (connections.HEARTBEAT, connections.MAIN):
            before = set(server.backend_pids(role))
            assert server.terminate_backends(role) >= 1
            wait_for(
                lambda role=role, before=before: set(server.backend_pids(role)) - before,
                what=f"a new {role} connection",
            )
        listen_cut_at = run.now()
        server.terminate_backends(connections.LISTEN)
        [second_listener] = wait_for(
            lambda: [pid for pid in _listeners(url) if pid != first_listener],
            what="the worker to LISTEN again",
        )
        listening_again_at = run.now()

        # The worker is idle once the long jobs are done; only a notification on the new
        # LISTEN session can bring it these jobs before the hour is up.
        wait_for(lambda: (run.counts() or {}).get("succeeded") == 4, what="the long jobs")
        run.produce(40, batch=10)
        run.wait_until_done(timeout=60)
        verdict = run.verdict()
        logs = workers.logs()
        long_attempts = {run.queue.get(job_id).attempts for job_id in long_jobs}

    assert second_listener != first_listener
    # The heartbeat's connection was cut while these ran past their lease; a new one
    # kept extending it.
    assert long_attempts == {1}
    assert "terminating connection due to administrator command" in logs
    assert "database available again" in logs
    assert verdict.broken_promises() == {}
    assert verdict.redeliveries == 0
    assert verdict.states == {"succeeded": 44}
    record_figures(
        "02-connections-terminated",
        verdict.figures(
            listening_again_after_seconds=round(
                (listening_again_at - listen_cut_at).total_seconds(), 3
            )
        ),
    )
