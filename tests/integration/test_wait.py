"""Waiting for a job to finish: ``Queue.wait`` and ``AsyncProducer.wait``, woken by the
done channel's announcements (one LISTEN connection per Queue), which the statements
that finish jobs send only for the jobs someone waits for. Real PostgreSQL; the
finishing is done by the worker's own statements (ack, fail, cancel, the cancel of
dependents) from other threads and connections."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from polling import wait_for
from psycopg import sql

from pgqueue import AsyncProducer, Job, JobNotFound, JobState, Queue, WorkerProtocol
from pgqueue.settings import done_channel


@pytest.fixture
def watched(queue: Queue) -> Iterator[Queue]:
    """``queue`` whose watcher re-reads states only once a minute: any wake-up within a
    test's few seconds comes from an announcement, not from the safety re-check."""
    queue.job_watcher().recheck_interval = 60.0
    yield queue


def claim(queue: Queue, task: str = "t") -> tuple[WorkerProtocol, Job]:
    protocol = WorkerProtocol(queue)
    (job,) = protocol.claim(["default"], [task], limit=1)
    return protocol, job


def later(seconds: float, action: Callable[[], object]) -> threading.Thread:
    """Run ``action`` on a thread after ``seconds``."""

    def run() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def waiter_rows(db: psycopg.Connection, schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.job_waiters").format(sql.Identifier(schema))
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_wait_returns_the_job_once_its_ack_announces_it(
    watched: Queue, db: psycopg.Connection, schema: str
) -> None:
    latencies = []
    for n in range(5):
        job = watched.enqueue("t", {"n": n}).job
        protocol, claimed = claim(watched)
        done: list[Job] = []
        thread = threading.Thread(target=lambda j=job, d=done: d.append(watched.wait(j.id, 30)))
        thread.start()
        wait_for(lambda: waiter_rows(db, schema) == 1, 10, what="the job to be recorded")
        protocol.ack(claimed, {"answer": n})
        acked_at = time.monotonic()
        thread.join(30)
        latencies.append(time.monotonic() - acked_at)
        assert done[0].state is JobState.SUCCEEDED and done[0].result == {"answer": n}
        wait_for(lambda: waiter_rows(db, schema) == 0, 10, what="the row to be deleted")
    # Long before the safety re-check (60 s): the announcement woke each. How soon is
    # measured by `pgqueue bench wait` (results/wait.json), not asserted here.
    assert max(latencies) < 30, latencies


def test_wait_returns_at_the_timeout_with_the_current_state(watched: Queue) -> None:
    job = watched.enqueue("t").job
    claim(watched)
    started = time.monotonic()
    current = watched.wait(job.id, timeout=0.5)
    took = time.monotonic() - started
    assert current.state is JobState.RUNNING
    assert 0.5 <= took < 2


def test_wait_for_a_final_job_returns_at_once_and_for_a_missing_one_raises(
    watched: Queue,
) -> None:
    job = watched.enqueue("t").job
    watched.cancel(job.id)
    started = time.monotonic()
    assert watched.wait(job.id, timeout=30).state is JobState.CANCELLED
    assert time.monotonic() - started < 2
    started = time.monotonic()
    with pytest.raises(JobNotFound):
        watched.wait(10**12, timeout=30)
    assert time.monotonic() - started < 2


def test_dead_jobs_cancels_and_cancelled_dependents_are_announced(
    watched: Queue, db: psycopg.Connection, schema: str
) -> None:
    doomed = watched.enqueue("t", max_attempts=1).job
    dependent = watched.enqueue("t", depends_on=[doomed.id]).job
    cancelled = watched.enqueue("u").job
    protocol, claimed = claim(watched)

    results: dict[int, JobState] = {}

    def wait_for_job(job_id: int) -> None:
        results[job_id] = watched.wait(job_id, timeout=30).state

    threads = [
        threading.Thread(target=wait_for_job, args=(job_id,))
        for job_id in (doomed.id, dependent.id, cancelled.id)
    ]
    for thread in threads:
        thread.start()
    # Finished once recorded: a statement under way as a job is recorded may miss it,
    # which the slow re-check (here a minute away) would settle.
    wait_for(lambda: waiter_rows(db, schema) == 3, 10, what="three jobs to be recorded")
    started = time.monotonic()
    protocol.fail(claimed, "no luck")
    watched.cancel(cancelled.id)
    for thread in threads:
        thread.join(30)
    assert results == {
        doomed.id: JobState.DEAD,
        dependent.id: JobState.CANCELLED,
        cancelled.id: JobState.CANCELLED,
    }
    assert time.monotonic() - started < 5


def test_a_dependent_cancelled_as_its_enqueue_commits_is_announced(
    watched: Queue, db: psycopg.Connection, schema: str, database_url: str
) -> None:
    # dependents_checked, run as an enqueue commits, cancels a job whose dependency died
    # while the enqueue's transaction was open. Nobody can wait for that job through
    # Queue.wait before the commit (it does not exist for them yet), so its row in
    # job_waiters is written here as a watcher writes it, and the announcement read on
    # the done channel.
    doomed = watched.enqueue("t", max_attempts=1).job
    protocol, claimed = claim(watched)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(done_channel(schema))))
        with watched.pool.connection() as conn:
            dependent = watched.enqueue("t", depends_on=[doomed.id], conn=conn).job
            assert dependent.state is JobState.WAITING
            protocol.fail(claimed, "no luck")
            db.execute(
                sql.SQL(
                    "INSERT INTO {}.job_waiters (job_id, waiter, expires_at)"
                    " VALUES (%s, 'test', now() + interval '1 minute')"
                ).format(sql.Identifier(schema)),
                (dependent.id,),
            )
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == [str(dependent.id)]
    assert watched.get(dependent.id).state is JobState.CANCELLED


def test_acks_announce_only_the_jobs_someone_waits_for(
    watched: Queue, db: psycopg.Connection, schema: str, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(done_channel(schema))))
        unwatched = watched.enqueue("t").job
        protocol, claimed = claim(watched)
        protocol.ack(claimed, None)
        assert list(listener.notifies(timeout=0.5)) == []

        job = watched.enqueue("t").job
        protocol, claimed = claim(watched)
        thread = threading.Thread(target=watched.wait, args=(job.id, 30))
        thread.start()
        wait_for(lambda: waiter_rows(db, schema) == 1, 10, what="the job to be recorded")
        protocol.ack(claimed, None)
        thread.join(30)
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
        assert payloads == [str(job.id)] and str(unwatched.id) not in payloads
    # The watcher deletes its row once nobody waits for the job.
    wait_for(lambda: waiter_rows(db, schema) == 0, 10, what="the row to be deleted")


def test_fifty_waits_are_recorded_together_and_woken_by_one_batch_of_acks(
    watched: Queue, db: psycopg.Connection, schema: str
) -> None:
    jobs = [watched.enqueue("t", {"n": n}).job for n in range(50)]
    states: list[JobState] = []
    threads = [
        threading.Thread(target=lambda j=j: states.append(watched.wait(j.id, 30).state))
        for j in jobs
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: waiter_rows(db, schema) == 50, 10, what="every job to be recorded")
    protocol = WorkerProtocol(watched)
    claimed = protocol.claim(["default"], ["t"], limit=50)
    protocol.ack_many([(job, None) for job in claimed])
    for thread in threads:
        thread.join(30)
    assert states == [JobState.SUCCEEDED] * 50


def test_a_lost_connection_is_made_again_and_every_waited_job_read(
    watched: Queue, db: psycopg.Connection, schema: str
) -> None:
    job = watched.enqueue("t").job
    protocol, claimed = claim(watched)
    waited: list[JobState] = []
    thread = threading.Thread(target=lambda: waited.append(watched.wait(job.id, 30).state))
    thread.start()
    watcher = watched.job_watcher()
    assert watcher.connected(10)
    wait_for(lambda: waiter_rows(db, schema) == 1, 10, what="the job to be recorded")
    # Cut the watcher off, and finish the job while it is gone: unlogged rows survive,
    # but the announcement reaches no one. Reconnecting reads the job's state anew.
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'pgqueue-wait' AND query LIKE %s",
        (f"%{schema}%",),
    )
    protocol.ack(claimed, {"after": "reconnect"})
    started = time.monotonic()
    thread.join(30)
    assert waited == [JobState.SUCCEEDED]
    # The reconnect's backoff starts at 0.1 s: far below the 60 s re-check.
    assert time.monotonic() - started < 10


def test_the_safety_recheck_finds_a_job_whose_announcement_was_missed(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    watcher = queue.job_watcher()
    watcher.recheck_interval = 0.5
    job = queue.enqueue("t").job
    waited: list[JobState] = []
    thread = threading.Thread(target=lambda: waited.append(queue.wait(job.id, 30).state))
    thread.start()
    wait_for(lambda: waiter_rows(db, schema) == 1, 10, what="the job to be recorded")
    # As if the cancel's statement had begun before the row was recorded: it does not
    # see the row, and announces nothing.
    with queue.pool.connection() as conn:
        conn.execute(sql.SQL("DELETE FROM {}.job_waiters").format(sql.Identifier(schema)))
        queue.cancel(job.id)
    thread.join(30)
    assert waited == [JobState.CANCELLED]


def test_async_producer_wait_holds_no_thread(queue: Queue) -> None:
    queue.job_watcher().recheck_interval = 60.0
    jobs = [queue.enqueue("t").job for _ in range(20)]

    async def main() -> list[JobState]:
        producer = await AsyncProducer.open(queue)
        try:
            waits = [asyncio.create_task(producer.wait(job.id, 30)) for job in jobs]
            await asyncio.sleep(0.5)
            assert queue.job_watcher().waiting == 20

            def finish() -> None:
                protocol = WorkerProtocol(queue)
                for claimed in protocol.claim(["default"], ["t"], limit=20):
                    protocol.ack(claimed, None)

            await asyncio.to_thread(finish)
            return [job.state for job in await asyncio.gather(*waits)]
        finally:
            await producer.close()

    started = time.monotonic()
    assert asyncio.run(main()) == [JobState.SUCCEEDED] * 20
    assert time.monotonic() - started < 10


def test_wait_refuses_a_bad_timeout(queue: Queue) -> None:
    from pgqueue import ValidationError

    job = queue.enqueue("t").job
    for bad in (-1, float("nan"), float("inf"), "10"):
        with pytest.raises(ValidationError):
            queue.wait(job.id, bad)
