"""A burst worker reaps expired leases before it concludes there is nothing left, and
reaping and pruning look after every queue of the schema, whatever queues the worker
serves (documented in ``pgqueue worker --help``)."""

from __future__ import annotations

import subprocess

import psycopg
import pytest
from polling import wait_for
from processes import pgqueue_command
from psycopg import sql
from worker_support import FAST, wait_until_state, worker_environment

from pgqueue import Job, JobState, Queue, WorkerProtocol

pytestmark = pytest.mark.slow


def _crashed_while_running(
    jobs: Queue, db: psycopg.Connection, schema: str, task: str, **options
) -> Job:
    """A job claimed by a worker that then died: running, its lease already expired."""
    job = jobs.enqueue(task, **options).job
    WorkerProtocol(jobs).claim([job.queue], [task], worker_id="crashed-worker", lease_seconds=600)
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (job.id,),
    )
    return job


def test_a_burst_worker_reaps_expired_leases_before_it_exits(
    start_worker, queue: Queue, db, schema
) -> None:
    retried = _crashed_while_running(queue, db, schema, "echo", max_attempts=3)
    last_try = _crashed_while_running(queue, db, schema, "echo", max_attempts=1)
    elsewhere = _crashed_while_running(queue, db, schema, "echo", queue="elsewhere")

    # The reaper thread's first round would come an hour later: only the burst's own
    # reap can put these jobs back before it exits. The long backoff keeps the retried
    # job queued after the reap, so the outcome does not depend on timing.
    worker = start_worker("--burst", "--reap-interval", "3600", "--retry-base", "3600")
    assert worker.wait() == 0, worker.log()

    assert queue.list(state="running").jobs == []
    job = queue.get(retried.id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 1)
    assert job.last_error.startswith("lease expired") and "crashed-worker" in job.last_error
    assert queue.get(last_try.id).state is JobState.DEAD
    # Reaping is schema-wide: also the queue this worker does not serve.
    assert queue.get(elsewhere.id).state is JobState.QUEUED
    assert "burst: reaped 3 jobs whose lease expired" in worker.log()


def test_a_worker_reaps_and_prunes_queues_it_does_not_serve(
    start_worker, queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    crashed = _crashed_while_running(queue, db, schema, "echo", queue="other", max_attempts=1)
    old = queue.enqueue("echo", queue="other").job
    protocol.ack(protocol.claim(["other"], ["echo"])[0], None)
    db.execute(
        sql.SQL(
            "UPDATE {}.finished_jobs SET finished_at = now() - interval '2 days' WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (old.id,),
    )

    worker = start_worker(
        *FAST, "--queue", "pq", "--prune-succeeded-after", "1h", "--prune-interval", "0.2"
    )
    wait_until_state(queue, crashed.id, JobState.DEAD)
    wait_for(
        lambda: old.id not in {job.id for job in queue.list(queue="other").jobs},
        what=f"the pruner; log:\n{worker.log()}",
    )
    assert worker.process.poll() is None, worker.log()


def test_worker_help_says_reaping_and_pruning_are_schema_wide(tmp_path) -> None:
    result = subprocess.run(
        [*pgqueue_command(), "worker", "--help"],
        env=worker_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "Reaping and pruning are schema-wide" in text
    assert "not only those it serves with --queue" in text
    assert "after reaping expired leases" in text
