"""Jobs that wait for other jobs, run by real ``pgqueue worker`` processes: a producer's
long transaction never holds the jobs its dependents wait for, and a released job's
timeline never starts before what it waited for ended."""

from __future__ import annotations

import time
from datetime import datetime

import psycopg
import pytest
from polling import wait_for
from worker_support import TEST_PLUGIN, hook_calls, wait_until_state

from pgqueue import BatchItem, JobSpec, JobState, Queue

pytestmark = pytest.mark.slow

LEASE = (
    "--lease-seconds",
    "2",
    "--heartbeat-seconds",
    "0.3",
    "--reap-interval",
    "0.2",
    "--poll-interval",
    "0.2",
)


def _lease_expires_at(db: psycopg.Connection, schema: str, job_id: int) -> datetime | None:
    row = db.execute(
        f"SELECT lease_expires_at FROM {schema}.active_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    return row[0] if row else None


def test_a_producer_transaction_longer_than_the_lease_holds_nothing_of_its_dependency(
    start_worker, queue: Queue, database_url: str, db: psycopg.Connection, schema: str, tmp_path
) -> None:
    # The dependency runs for 5 s under a 2 s lease, kept by heartbeats; the producer's
    # transaction naming it stays open for 8 s, past both.
    dependency = queue.enqueue("whoami", {"seconds": 5}).job
    for _ in range(2):  # a second worker, whose reaper would take an expired lease
        start_worker(*LEASE, "--plugin", TEST_PLUGIN)
    wait_until_state(queue, dependency.id, JobState.RUNNING)
    claimed_until = _lease_expires_at(db, schema, dependency.id)
    leases = []
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")  # the producer's own work, in its transaction
        dependent = queue.enqueue("whoami", depends_on=[dependency.id], conn=conn).job
        assert dependent.state is JobState.WAITING
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            leases.append(_lease_expires_at(db, schema, dependency.id))
            time.sleep(0.2)
        # The dependency's ack did not wait for this transaction.
        acked = queue.get(dependency.id)
        assert acked.state is JobState.SUCCEEDED, acked
        conn.commit()

    done = wait_until_state(queue, dependent.id, JobState.SUCCEEDED)
    # Heartbeats kept extending the lease while the transaction was open: it was never
    # reaped, and it ran once.
    assert max(lease for lease in leases if lease is not None) > claimed_until
    assert (acked.attempts, acked.errors) == (1, [])
    assert done.attempts == 1 and done.started_at >= acked.finished_at
    starts = [call["job_id"] for call in hook_calls(tmp_path) if call["hook"] == "on_start"]
    assert sorted(starts) == [dependency.id, dependent.id]


FAN_INS = 100
FAN_IN = 10


def test_a_released_job_never_starts_before_its_dependencies_finished(
    start_worker, queue: Queue
) -> None:
    # Ten dependencies of about the same length per fan-in, on one-slot workers whose
    # acks ride with their next claim: the last two acks of a fan-in often race, and the
    # worker that queues the dependent claims it in the same transaction.
    specs = []
    for n in range(FAN_INS):
        first = len(specs)
        specs += [JobSpec("whoami", {"seconds": 0.02}) for _ in range(FAN_IN)]
        specs.append(
            JobSpec(
                "whoami", {"fan_in": n}, depends_on=[BatchItem(first + i) for i in range(FAN_IN)]
            )
        )
    results = queue.enqueue_many(specs)
    for _ in range(4):
        start_worker(*LEASE, "--concurrency", "1", "--prefetch", "0", "--plugin", TEST_PLUGIN)

    ids = [result.job.id for result in results]
    wait_for(
        lambda: {s.queue: s.counts for s in queue.stats()}["default"]["succeeded"] == len(ids),
        what="every job to succeed",
    )
    jobs = {job_id: queue.get(job_id) for job_id in ids}
    early = []
    for n in range(FAN_INS):
        group = ids[n * (FAN_IN + 1) : (n + 1) * (FAN_IN + 1)]
        dependent = jobs[group[-1]]
        last = max(jobs[job_id].finished_at for job_id in group[:-1])
        if dependent.started_at < last:
            early.append((dependent.id, dependent.started_at, last))
    assert early == []
