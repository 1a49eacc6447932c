"""Scenario 8: deadlock hunting.

Everything that locks jobs runs at once, for ``PGQUEUE_FAULTS_DEADLOCK_SECONDS``
(10 s by default; ``nox -s faults`` runs a minute): two workers with many slots writing
batched acks and claiming in one transaction, heartbeating every 100 ms on connections
of their own, failing a fifth of their attempts; each worker frozen in turn past its
lease, so the other's reaper takes its jobs back while it holds them; a producer; an
operator cancelling jobs (running ones too) and retrying dead and cancelled ones; the
pruner deleting finished jobs within a second of their finishing. The server detects
deadlocks after 100 ms instead of a second, so a lock-order cycle cannot hide.

pgqueue takes its row locks in a consistent order, so PostgreSQL must report no
deadlock at all; and nothing acknowledged may be lost or acked twice.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fault_sql
import psycopg
from fault_support import SCHEMA, FaultRun, prepare_schema, work_jobs
from polling import wait_for

from pgqueue import (
    DatabaseUnavailable,
    InvalidTransition,
    Job,
    JobNotFound,
    JobState,
    Lease,
    LifecycleHooks,
    Queue,
    WorkerProtocol,
    get_plugin_manager,
    hookimpl,
)

SECONDS = float(os.environ.get("PGQUEUE_FAULTS_DEADLOCK_SECONDS", "10"))
RETENTION = {"succeeded": 0.5, "cancelled": 1.0, "dead": 1.0}


def _deadlock_reports(server_log: str) -> list[str]:
    """Each "deadlock detected" error in the server log, with the statements involved."""
    reports = []
    lines = server_log.splitlines()
    for n, line in enumerate(lines):
        if "deadlock detected" in line:
            report = [line]
            for following in lines[n + 1 : n + 40]:
                if (
                    following[:4].isdigit()
                    and "DETAIL" not in following
                    and "STATEMENT" not in following
                ):
                    break
                report.append(following)
            reports.append("\n".join(report))
    return reports


class Chaos:
    """The operator's side of the scenario, each duty on a thread of its own."""

    def __init__(self, queue: Queue, worker_pids: list[int]) -> None:
        self.queue = queue
        self.worker_pids = worker_pids
        self.counts: Counter[str] = Counter()
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._every, args=(0.01, self._cancel), daemon=True),
            threading.Thread(target=self._every, args=(0.01, self._retry), daemon=True),
            threading.Thread(target=self._every, args=(0.1, self._prune), daemon=True),
            threading.Thread(target=self._every, args=(0.5, self._freeze), daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopped.set()
        for thread in self._threads:
            thread.join(30)
        for pid in self.worker_pids:  # none is left frozen
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _every(self, interval: float, duty: Callable[[], None]) -> None:
        while not self._stopped.wait(interval):
            try:
                duty()
            except (DatabaseUnavailable, InvalidTransition, JobNotFound):
                self.counts["refused"] += 1  # lost a race with a worker or the pruner

    def _cancel(self) -> None:
        recent = self.queue.list(limit=50).jobs
        candidates = [job for job in recent if job.state in (JobState.QUEUED, JobState.RUNNING)]
        if candidates:
            self.queue.cancel(random.choice(candidates).id)
            self.counts["cancelled"] += 1

    def _retry(self) -> None:
        state = random.choice(["dead", "cancelled"])
        for job in self.queue.list(state=state, limit=5).jobs:
            self.queue.retry(job.id)
            self.counts["retried"] += 1

    def _prune(self) -> None:
        # Both prunings: the pruner's round (its days exist, none has expired yet, so it
        # takes the history's locks and drops nothing) and pruning by hand, which
        # deletes finished rows as acks, cancels and retries move jobs in and out.
        self.queue.prune_expired(RETENTION, batch_size=50)
        self.counts["pruned"] += self.queue.prune(RETENTION["succeeded"], batch_size=50)

    def _freeze(self) -> None:
        # Past the 1 s lease: the other worker's reaper takes this one's jobs back while
        # it still holds them, and its late outcomes meet the fencing token.
        pid = self.worker_pids[self.counts["frozen"] % len(self.worker_pids)]
        os.kill(pid, signal.SIGSTOP)
        self._stopped.wait(1.5)
        os.kill(pid, signal.SIGCONT)
        self.counts["frozen"] += 1


def test_reaper_pruner_batched_acks_cancels_and_retries_together_never_deadlock(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server(settings={"deadlock_timeout": "100ms"})
    url = server.url()
    with FaultRun.prepared(url, tmp_path) as run, Queue.connect(url, schema=SCHEMA) as operator:
        workers = run.start_workers(
            2,
            concurrency=16,
            lease_seconds=1.0,
            heartbeat_seconds=0.1,
            reap_interval=0.1,
            retry_base=0.01,
            retry_cap=0.05,
        )
        producer = run.produce(
            1_000_000, batch=8, pause=0.03, max_attempts=3, ms=[0, 20], fail_rate=0.2
        )
        chaos = Chaos(operator, [process.pid for process in workers.processes])
        chaos.start()
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            run.check_workers()
            time.sleep(0.5)
        producer.stop()
        chaos.stop()

        run.wait_until_done()
        verdict = run.verdict(expect=(JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED))
        time.sleep(1.0)  # the statistics collector's flush interval
        deadlocks = fault_sql.run(url, "deadlocks_reported")[0]["deadlocks"]
        logs = workers.logs()
        server_log = server.log_path.read_text(errors="replace")

    assert chaos.counts["cancelled"] and chaos.counts["retried"] and chaos.counts["pruned"]
    assert chaos.counts["frozen"] >= 2
    assert _deadlock_reports(server_log) == []
    assert deadlocks == 0
    assert [line for line in logs.splitlines() if "deadlock" in line] == []
    assert verdict.broken_promises() == {}
    record_figures(
        "08-deadlock-hunt",
        verdict.figures(
            seconds=SECONDS,
            deadlocks=deadlocks,
            cancels=chaos.counts["cancelled"],
            retries=chaos.counts["retried"],
            pruned=chaos.counts["pruned"],
            workers_frozen=chaos.counts["frozen"],
            operator_calls_refused=chaos.counts["refused"],
        ),
    )


class SuccessRecorder:
    """A plugin recording every on_success call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    @hookimpl
    def on_success(self, job: Job) -> None:
        self.calls.append((job.id, job.attempts))


def test_a_stale_outcome_batched_with_the_current_one_of_the_same_job_is_not_acked(
    server_database: str,
) -> None:
    # What the hunt above once caught: a worker held attempt 2 of a job when an operator
    # cancelled and retried it, and the same worker claimed it again (attempt 1 anew);
    # both handlers finished, and one batch carried both outcomes.
    prepare_schema(server_database)
    recorder = SuccessRecorder()
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(recorder, name="success-recorder")
    with Queue.connect(server_database, schema=SCHEMA, hooks=LifecycleHooks(pm)) as queue:
        protocol = WorkerProtocol(queue)
        job_id = queue.enqueue("fault_work", {}).job.id
        [stale] = protocol.claim(["default"], ["fault_work"], 1)
        queue.cancel(job_id)
        queue.retry(job_id)
        [current] = protocol.claim(["default"], ["fault_work"], 1)

        batch = protocol.ack_many([(stale, {"by": "stale"}), (current, {"by": "current"})])
        stored = queue.get(job_id)

    assert [(job.id, job.attempts) for job in batch.succeeded] == [(job_id, 1)]
    assert batch.lost == [job_id]
    assert batch.lost_leases == [Lease(job_id, stale.lease_token)]
    assert recorder.calls == [(job_id, 1)]
    assert (stored.state, stored.result) == (JobState.SUCCEEDED, {"by": "current"})


def test_a_heartbeat_skips_rows_an_ack_holds_instead_of_waiting_for_them(start_server) -> None:
    # What the hunt above once caught: an ack and a heartbeat over the same leases, each
    # holding a row the other waited for (their plans visited the rows in different
    # orders). A heartbeat now never waits for a row lock, so it cannot be one side of
    # such a cycle. Here another session holds the second job's row; the ack has locked
    # the first and queues for the second.
    server = start_server(settings={"deadlock_timeout": "100ms"})
    url = server.url()
    prepare_schema(url)
    outcome: dict[str, Any] = {}
    with Queue.connect(url, schema=SCHEMA, max_size=4) as queue, psycopg.connect(url) as holder:
        protocol = WorkerProtocol(queue)
        queue.enqueue_many(work_jobs(3, "trio"))
        first, second, third = sorted(
            protocol.claim(["default"], ["fault_work"], 3, lease_seconds=60),
            key=lambda job: job.id,
        )
        fault_sql.execute(holder, "jobs_lock_rows", {"ids": [second.id]}, schema=SCHEMA)

        def ack() -> None:
            try:
                outcome["ack"] = protocol.ack_many([(first, 1), (second, 2)])
            except DatabaseUnavailable as exc:
                outcome["ack"] = exc

        acker = threading.Thread(target=ack)
        acker.start()
        wait_for(
            lambda: fault_sql.run(url, "sessions_waiting_on_locks")[0]["waiting"] == 1,
            what="the ack to wait for the held row",
        )
        leases = [Lease(job.id, job.lease_token) for job in (third, second, first)]
        lost_while_locked = protocol.heartbeat(leases, 120)
        still_waiting = fault_sql.run(url, "sessions_waiting_on_locks")[0]["waiting"]
        extended = queue.get(third.id).lease_expires_at
        holder.rollback()
        acker.join(60)
        lost_after_ack = protocol.heartbeat(leases, 120)

    # Locked rows were skipped, not waited for and not called lost; the free one was
    # extended (to two minutes, from the claim's one).
    assert lost_while_locked == set()
    assert still_waiting == 1
    assert extended > third.lease_expires_at
    assert not isinstance(outcome["ack"], Exception), outcome["ack"]
    assert [job.id for job in outcome["ack"].succeeded] == [first.id, second.id]
    assert lost_after_ack == {first.id, second.id}
    assert "deadlock detected" not in server.log_path.read_text(errors="replace")
