"""Ack, fail, reap, cancel and retry: fencing, backoff, attempts and dead-lettering."""

import time
from datetime import timedelta

import pytest

from pgqueue import InvalidTransition, JobNotFound, JobState, LeaseLost, Queue, WorkerProtocol
from pgqueue.backoff import backoff_ceiling


def claim_one(queue: Queue, **kwargs):
    protocol = WorkerProtocol(queue)
    (job,) = protocol.claim(["default"], ["t"], limit=1, **kwargs)
    return job


def test_ack_stores_the_result_and_finishes_the_job(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    job = protocol.ack(claim_one(queue), {"answer": 42})
    assert job.state is JobState.SUCCEEDED and job.result == {"answer": 42}
    assert job.finished_at >= job.started_at and job.lease_token is None


def test_stale_worker_cannot_ack_after_its_lease_was_reaped(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    stale = claim_one(queue, lease_seconds=0.2)
    time.sleep(0.4)
    (reaped,) = protocol.reap()
    assert reaped.state is JobState.QUEUED and "lease expired" in reaped.last_error
    with pytest.raises(LeaseLost):
        protocol.ack(stale, "late")
    with pytest.raises(LeaseLost):
        protocol.fail(stale, "late")
    # The job is claimable again, and the new attempt's ack is the one that counts.
    make_runnable(queue)
    fresh = claim_one(queue)
    assert fresh.attempts == 2 and fresh.lease_token != stale.lease_token
    assert protocol.ack(fresh, "fresh").result == "fresh"
    with pytest.raises(LeaseLost):
        protocol.ack(stale, "late again")
    assert queue.get(fresh.id).result == "fresh"


def test_cancelling_a_running_job_revokes_its_lease(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    running = claim_one(queue)
    assert queue.cancel(running.id).state is JobState.CANCELLED
    with pytest.raises(LeaseLost):
        protocol.ack(running, "too late")
    assert queue.get(running.id).state is JobState.CANCELLED
    with pytest.raises(InvalidTransition, match="cancelled"):
        queue.cancel(running.id)
    with pytest.raises(JobNotFound):
        queue.cancel(10**12)


def make_runnable(queue: Queue) -> None:
    with queue.pool.connection() as conn:
        conn.execute(f"UPDATE {queue.schema}.active_jobs SET run_at = now() WHERE state = 'queued'")


def test_a_job_that_keeps_failing_is_dead_after_max_attempts(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t", max_attempts=3)
    for attempt in (1, 2, 3):
        job = claim_one(queue)
        assert job.attempts == attempt
        failed = protocol.fail(job, RuntimeError(f"boom {attempt}"))
        make_runnable(queue)
    assert failed.state is JobState.DEAD and failed.attempts == 3
    assert failed.last_error == "RuntimeError: boom 3" and failed.finished_at is not None
    assert protocol.claim(["default"], ["t"], limit=1) == []


def test_attempts_count_claims_so_two_failures_then_success_is_three(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    for _ in range(2):
        protocol.fail(claim_one(queue), "no")
        make_runnable(queue)
    done = protocol.ack(claim_one(queue), "yes")
    assert (done.state, done.attempts) == (JobState.SUCCEEDED, 3)


def test_failed_attempt_backs_off_within_half_to_full_ceiling(queue):
    q = Queue(queue.pool, schema=queue.schema, retry_base=10, retry_cap=1000)
    q_protocol = WorkerProtocol(q)
    q.enqueue("t")
    job = claim_one(q)
    failed = q_protocol.fail(job, "x")
    delay = (failed.run_at - job.started_at).total_seconds()
    assert backoff_ceiling(1, 10, 1000) / 2 - 1 <= delay <= backoff_ceiling(1, 10, 1000) + 1


def test_reaper_backs_off_and_dead_letters_expired_leases(queue):
    q = Queue(queue.pool, schema=queue.schema, retry_base=100, retry_cap=1000)
    q_protocol = WorkerProtocol(q)
    q.enqueue("t", max_attempts=2)
    q_protocol.claim(["default"], ["t"], limit=1, lease_seconds=0.1)
    time.sleep(0.3)
    (requeued,) = q_protocol.reap()
    wait = requeued.run_at - requeued.started_at
    assert timedelta(seconds=50) <= wait <= timedelta(seconds=101)
    make_runnable(q)
    q_protocol.claim(["default"], ["t"], limit=1, lease_seconds=0.1)
    time.sleep(0.3)
    (dead,) = q_protocol.reap()
    assert dead.state is JobState.DEAD and dead.attempts == 2


def test_only_one_reaper_runs_at_a_time(queue):
    protocol = WorkerProtocol(queue)
    with queue.pool.connection() as holder:
        from pgqueue.locks import advisory_key

        holder.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("reap", queue.schema),))
        assert protocol.reap() is None
    assert protocol.reap() == []


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (float("nan"), "NaN"),
        ({"text": "nul\x00here"}, "NUL"),
        ({"when": object()}, "not JSON-serialisable"),
    ],
)
def test_a_result_postgres_cannot_store_becomes_a_failed_attempt(queue, result, reason):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    job = protocol.ack(claim_one(queue), result)
    assert job.state is JobState.QUEUED and job.attempts == 1
    assert job.last_error.startswith("result could not be stored") and reason in job.last_error


def test_an_error_message_with_nul_is_stored(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    failed = protocol.fail(claim_one(queue), "bad\x00byte")
    assert failed.last_error == "bad\\0byte"


def test_retry_puts_dead_and_cancelled_jobs_back_with_attempts_reset(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("t", max_attempts=1)
    dead = protocol.fail(claim_one(queue), "x")
    assert dead.state is JobState.DEAD
    again = queue.retry(dead.id)
    assert (again.state, again.attempts) == (JobState.QUEUED, 0)
    assert claim_one(queue).id == dead.id
    with pytest.raises(InvalidTransition, match="running"):
        queue.retry(dead.id)
    cancelled = queue.cancel(queue.enqueue("t").job.id)
    assert queue.retry(cancelled.id).state is JobState.QUEUED


def test_ack_many_tells_each_lost_lease_apart_from_the_acked_jobs_around_it(queue):
    """A batch in any order, with lost leases among held ones: each outcome is matched
    to its own job, whatever its place in the batch."""
    protocol = WorkerProtocol(queue)
    for seq in range(6):
        queue.enqueue("t", {"seq": seq})
    jobs = protocol.claim(["default"], ["t"], limit=6)
    cancelled = {jobs[1].id, jobs[4].id}
    for job_id in cancelled:
        queue.cancel(job_id)
    shuffled = [jobs[5], jobs[1], jobs[0], jobs[4], jobs[3], jobs[2]]
    batch = protocol.ack_many([(job, {"seq": job.payload["seq"]}) for job in shuffled])
    assert sorted(batch.lost) == sorted(cancelled)
    assert {lease.job_id for lease in batch.lost_leases} == cancelled
    acked = {job.id: job for job in batch.succeeded}
    assert sorted(acked) == sorted(job.id for job in jobs if job.id not in cancelled)
    for job_id, job in acked.items():
        stored = queue.get(job_id)
        assert job.state is stored.state is JobState.SUCCEEDED
        assert job.result == stored.result == {"seq": stored.payload["seq"]}
        assert job.finished_at == stored.finished_at and job.lease_token is None
    assert {queue.get(job_id).state for job_id in cancelled} == {JobState.CANCELLED}


def test_one_batch_writes_successes_failures_and_the_dead_together(queue):
    """finish_many writes a batch's successes, retries, dead-letters and a result that
    cannot be stored in one statement, counts each, and refuses the lost lease alone."""
    protocol = WorkerProtocol(queue)
    queue.enqueue("t", {"n": 0})
    queue.enqueue("t", {"n": 1})
    queue.enqueue("t", {"n": 2}, max_attempts=1)
    queue.enqueue("t", {"n": 3})
    queue.enqueue("t", {"n": 4})
    ok, retried, dead, unstorable, lost = protocol.claim(["default"], ["t"], limit=5)
    queue.cancel(lost.id)

    batch = protocol.finish_many(
        [(ok, {"done": True}), (unstorable, float("nan")), (lost, "late")],
        [(retried, "boom"), (dead, ValueError("bad"))],
    )

    assert [job.id for job in batch.succeeded] == [ok.id]
    assert batch.lost == [lost.id]
    states = {job.id: job.state for job in batch.failed}
    assert states == {
        retried.id: JobState.QUEUED,
        dead.id: JobState.DEAD,
        unstorable.id: JobState.QUEUED,
    }
    for job in batch.failed:
        stored = queue.get(job.id)
        assert (stored.state, stored.run_at, stored.last_error) == (
            job.state,
            job.run_at,
            job.last_error,
        )
        assert stored.errors == job.errors and stored.errors[-1]["error"] == job.last_error
    assert queue.get(dead.id).last_error == "ValueError: bad"
    assert queue.get(dead.id).finished_at == batch.succeeded[0].finished_at
    # The retry backs off by pgqueue.backoff's rule for the first failed attempt.
    delay = (queue.get(retried.id).run_at - batch.succeeded[0].finished_at).total_seconds()
    ceiling = backoff_ceiling(1, queue.retry_base, queue.retry_cap)
    assert ceiling / 2 <= delay <= ceiling
    (counts,) = queue.metrics_snapshot().queues
    assert (counts.completed, counts.failures) == (1, 3)
    assert counts.jobs["succeeded"] == 1 and counts.jobs["dead"] == 1
