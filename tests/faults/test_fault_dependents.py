"""Scenario 12: producers whose transactions hold dependents past the lease.

Jobs that each run for longer than their lease, kept alive by heartbeats, are named as
dependencies by producers that enqueue, inside transactions of their own, jobs waiting
for them, and keep those transactions open for three leases before they commit (or, one
time in four, roll back). Nothing the producers do may hold the running jobs: their
heartbeats go on, so none is reaped and run twice, their acks do not wait for the
producers, and every committed dependent is released exactly once, after everything it
waited for succeeded. A rolled-back dependent leaves nothing behind.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import psycopg
from fault_support import FaultRun, work_jobs
from polling import wait_for

from pgqueue import JobNotFound, JobSpec, JobState

LEASE_SECONDS = 3.0
HOLD_SECONDS = 3 * LEASE_SECONDS
DEPENDENCIES = 40
PRODUCERS = 4
TRANSACTIONS = 3
"""Per producer, one after the other."""


def test_producer_transactions_holding_dependents_past_the_lease(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    with FaultRun.prepared(server.url(), tmp_path) as run:
        run.start_workers(2, lease_seconds=LEASE_SECONDS)
        # Each runs for one to two leases: several are running whenever a producer
        # names them, some are still queued, some have already succeeded.
        ms = [int(LEASE_SECONDS * 1000), int(2 * LEASE_SECONDS * 1000)]
        dependencies = run.enqueue(work_jobs(DEPENDENCIES, "dependency", ms=ms))
        wait_for(
            lambda: any(run.queue.get(i).state is JobState.RUNNING for i in dependencies),
            what="a dependency to be running",
        )

        committed: dict[str, int] = {}
        rolled_back: list[int] = []
        waits: list[tuple[int, list[int]]] = []
        lock = threading.Lock()

        errors: list[BaseException] = []

        def produce(producer: int) -> None:
            try:
                transactions(producer)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        def transactions(producer: int) -> None:
            rng = random.Random(producer)
            for n in range(TRANSACTIONS):
                names = sorted(rng.sample(dependencies, rng.randint(1, 3)))
                key = f"dependent-{producer}-{n}"
                with psycopg.connect(run.url) as conn:
                    conn.execute("SELECT 1")  # the producer's own work, in its transaction
                    spec = JobSpec(
                        "fault_work",
                        {"ms": [10, 40]},
                        queue="default",
                        idempotency_key=key,
                        depends_on=names,
                    )
                    [result] = run.queue.enqueue_many([spec], conn=conn)
                    time.sleep(HOLD_SECONDS)
                    keep = rng.random() >= 0.25
                    if keep:
                        conn.commit()
                    else:
                        conn.rollback()
                with lock:
                    if keep:
                        committed[key] = result.job.id
                        waits.append((result.job.id, names))
                    else:
                        rolled_back.append(result.job.id)

        producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join(HOLD_SECONDS * TRANSACTIONS * 4)
        assert not any(thread.is_alive() for thread in producers)
        assert errors == []
        run.acknowledge(committed)

        run.wait_until_done()
        verdict = run.verdict()
        jobs = {i: run.queue.get(i) for i in [*dependencies, *committed.values()]}
        stuck = [job.id for job in jobs.values() if job.state is JobState.WAITING]
        early = [
            dependent
            for dependent, names in waits
            if any(jobs[dependent].started_at < jobs[name].finished_at for name in names)
        ]
        reaped = [i for i in dependencies if jobs[i].attempts > 1 or jobs[i].errors]
        left_behind = [i for i in rolled_back if _exists(run, i)]

    assert verdict.broken_promises() == {}
    assert (stuck, early, left_behind) == ([], [], [])
    assert reaped == [], "a dependency's lease ran out while a producer named it"
    record_figures(
        "13-producer-holds-dependents",
        verdict.figures(
            stuck=len(stuck),
            producer_transactions=PRODUCERS * TRANSACTIONS,
            rolled_back=len(rolled_back),
            held_seconds=HOLD_SECONDS,
            lease_seconds=LEASE_SECONDS,
            dependencies_reaped=len(reaped),
            started_before_a_dependency_finished=len(early),
        ),
    )


def _exists(run: FaultRun, job_id: int) -> bool:
    try:
        run.queue.get(job_id)
    except JobNotFound:
        return False
    return True
