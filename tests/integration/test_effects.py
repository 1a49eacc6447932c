"""job.complete, job.fence, job.effect_key and job.set_result on claims of a real
PostgreSQL, without a worker: the completion commits with the caller's writes or not at
all, is fenced by the lease, and fails the caller's transaction when the lease is gone."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import pickle
import threading
import time
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import psycopg.errors
import pytest

from pgqueue import (
    InvalidTransition,
    Job,
    JobState,
    Lease,
    LeaseLost,
    NotAnAttempt,
    Queue,
    ValidationError,
    WorkerProtocol,
    effects,
)
from pgqueue.effects import CompletionState

KATHMANDU = ZoneInfo("Asia/Kathmandu")


@pytest.fixture
def app_table(db: psycopg.Connection, schema: str) -> str:
    """An application's own table, in the test's schema: one row per effect."""
    db.execute(f"CREATE TABLE {schema}.app_rows (job_id bigint NOT NULL, note text)")
    return f"{schema}.app_rows"


def claim(queue: Queue, count: int = 1, **options: Any) -> list[Job]:
    return WorkerProtocol(queue).claim(["default"], ["t"], count, **options)


def claim_one(queue: Queue, **options: Any) -> Job:
    queue.enqueue("t", {"n": 1})
    (job,) = claim(queue, **options)
    return job


def rows(db: psycopg.Connection, table: str) -> list[tuple[Any, ...]]:
    return db.execute(f"SELECT job_id, note FROM {table} ORDER BY job_id, note").fetchall()


def counters(db: psycopg.Connection, queue: Queue) -> tuple[int, int]:
    """The queue counters' succeeded and completed, summed over their slots."""
    row = db.execute(
        f"SELECT sum(succeeded)::int, sum(completed)::int FROM {queue.schema}.queue_counters"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_complete_commits_with_the_callers_own_write(queue, database_url, db, app_table):
    job = claim_one(queue)
    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'mine')", (job.id,))
        job.complete(conn, {"sent": True})
        # Not yet committed: nobody else sees either.
        assert queue.get(job.id).state is JobState.RUNNING
        assert rows(db, app_table) == []
    done = queue.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.result == {"sent": True}
    assert done.lease_token is None and done.last_error is None
    assert rows(db, app_table) == [(job.id, "mine")]
    # Counted as an ack is: succeeded and completed, once, and its run time measured.
    assert counters(db, queue) == (1, 1)
    (run_times,) = queue.run_times()
    assert sum(run_times.counts) == 1
    check = WorkerProtocol(queue).check_completions([job])
    assert check[0].state is CompletionState.COMMITTED
    assert check[0].job is not None and check[0].job.result == {"sent": True}
    assert check[0].job.finished_at == done.finished_at


def test_a_rolled_back_completion_leaves_the_job_running(queue, database_url, db, app_table):
    job = claim_one(queue)
    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'mine')", (job.id,))
        job.complete(conn, 1)
        conn.rollback()
    assert queue.get(job.id).state is JobState.RUNNING
    assert rows(db, app_table) == []
    protocol = WorkerProtocol(queue)
    assert protocol.check_completions([job])[0].state is CompletionState.NOT_COMMITTED
    # The lease is still this attempt's: a second try in a new transaction completes it.
    with psycopg.connect(database_url) as conn:
        job.complete(conn, 2)
    assert queue.get(job.id).result == 2
    assert protocol.check_completions([job])[0].job.result == 2  # type: ignore[union-attr]


def test_a_completion_in_a_savepoint_rolled_back_does_not_count(queue, database_url, db, app_table):
    job = claim_one(queue)
    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'outer')", (job.id,))
        with pytest.raises(RuntimeError), conn.transaction():
            job.complete(conn)
            raise RuntimeError("undo the savepoint")
    # The outer transaction committed; the completion, in its savepoint, did not.
    assert rows(db, app_table) == [(job.id, "outer")]
    assert queue.get(job.id).state is JobState.RUNNING
    check = WorkerProtocol(queue).check_completions([job])
    assert check[0].state is CompletionState.NOT_COMMITTED


def test_a_completion_in_a_savepoint_that_is_kept_counts(queue, database_url):
    job = claim_one(queue)
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")
        with conn.transaction():  # a savepoint: the transaction is open already
            job.complete(conn, "kept")
    assert queue.get(job.id).state is JobState.SUCCEEDED
    check = WorkerProtocol(queue).check_completions([job])
    assert check[0].state is CompletionState.COMMITTED


def test_an_open_completion_is_told_apart(queue, database_url):
    job = claim_one(queue)
    protocol = WorkerProtocol(queue)
    with psycopg.connect(database_url) as conn:
        job.complete(conn)
        assert protocol.check_completions([job])[0].state is CompletionState.OPEN
    assert protocol.check_completions([job])[0].state is CompletionState.COMMITTED


def test_complete_after_the_lease_was_reaped_fails_the_transaction(
    queue, database_url, db, app_table
):
    protocol = WorkerProtocol(queue)
    stale = claim_one(queue, lease_seconds=0.2)
    time.sleep(0.4)
    (reaped,) = protocol.reap()
    assert reaped.state is JobState.QUEUED
    db.execute(f"UPDATE {queue.schema}.active_jobs SET run_at = now()")
    (fresh,) = claim(queue)
    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'fresh')", (fresh.id,))
        fresh.complete(conn, "fresh")

    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'stale')", (stale.id,))
        with pytest.raises(LeaseLost, match="cannot commit") as raised:
            stale.complete(conn, "stale")
        # PostgreSQL failed the transaction itself: nothing more runs in it, and its
        # commit rolls it back.
        cause = raised.value.__cause__
        assert isinstance(cause, psycopg.Error) and cause.sqlstate == effects.LEASE_LOST_SQLSTATE
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.commit()
    assert rows(db, app_table) == [(stale.id, "fresh")]
    done = queue.get(stale.id)
    assert done.state is JobState.SUCCEEDED and done.result == "fresh" and done.attempts == 2
    assert effects.completions(stale) == []
    assert counters(db, queue) == (1, 1)


def test_a_caught_lease_lost_cannot_commit_the_transaction(queue, database_url, db, app_table):
    job = claim_one(queue)
    queue.cancel(job.id)
    with psycopg.connect(database_url) as conn, conn.transaction():
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'written anyway?')", (job.id,))
        # A handler that swallows it: the transaction still cannot commit.
        with contextlib.suppress(LeaseLost):
            job.complete(conn)
    assert rows(db, app_table) == []
    assert queue.get(job.id).state is JobState.CANCELLED


def test_complete_on_a_cancelled_job_keeps_it_cancelled(queue, database_url, db, app_table):
    job = claim_one(queue)
    assert queue.cancel(job.id).state is JobState.CANCELLED
    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'x')", (job.id,))
        with pytest.raises(LeaseLost):
            job.complete(conn, "late")
    cancelled = queue.get(job.id)
    assert cancelled.state is JobState.CANCELLED and cancelled.result is None
    assert rows(db, app_table) == []


def test_complete_on_an_autocommit_connection_commits_alone(queue, database_url):
    job = claim_one(queue)
    with psycopg.connect(database_url, autocommit=True) as conn:
        job.complete(conn, "now")
        assert queue.get(job.id).state is JobState.SUCCEEDED
    check = WorkerProtocol(queue).check_completions([job])
    assert check[0].state is CompletionState.COMMITTED


def test_complete_refuses_a_result_it_cannot_store_before_sending_anything(
    database_url, schema, db
):
    small = Queue.connect(database_url, schema=schema, max_result_bytes=100)
    try:
        job = claim_one(small)
        with psycopg.connect(database_url) as conn:
            conn.execute("SELECT 1")
            with pytest.raises(ValidationError, match="result is 202 bytes, over the limit of 100"):
                job.complete(conn, "x" * 200)
            with pytest.raises(ValidationError, match=r"result:.*NaN"):
                job.complete(conn, float("nan"))
            with pytest.raises(ValidationError, match="result"):
                job.set_result("y" * 200)
            # The caller's transaction is intact, and the lease still held.
            assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
            job.complete(conn, "fits")
        assert small.get(job.id).result == "fits"
    finally:
        small.close()


def test_a_job_not_handed_out_by_a_claim_says_so(queue, database_url):
    job = queue.enqueue("t").job
    with psycopg.connect(database_url) as conn:
        for call in (
            lambda: job.complete(conn),
            lambda: job.fence(conn),
            lambda: job.effect_key("charge"),
            lambda: job.set_result(1),
            lambda: job.transaction().__enter__(),
        ):
            with pytest.raises(NotAnAttempt, match=f"job {job.id}: it is not a running attempt"):
                call()
    # A claimed job outside a worker lends no connection.
    claimed = claim(queue)[0]
    with pytest.raises(NotAnAttempt, match="lends no connections"):
        claimed.transaction().__enter__()
    with pytest.raises(TypeError, match="psycopg Connection"):
        claimed.complete("postgresql://")  # type: ignore[call-overload]


def test_a_claimed_job_pickles_and_copies_as_its_row_without_the_attempt(queue, database_url):
    """A handler may hand its job to a process pool: the copy is the row, and only the
    original holds the attempt."""
    claimed = claim_one(queue)
    for copied in (pickle.loads(pickle.dumps(claimed)), copy.deepcopy(claimed)):
        assert copied == claimed and copied.payload == {"n": 1}
        with psycopg.connect(database_url) as conn, pytest.raises(NotAnAttempt):
            copied.complete(conn)
    with psycopg.connect(database_url) as conn:
        claimed.complete(conn, "done")
    assert queue.get(claimed.id).result == "done"


def test_complete_respects_the_queue_schema(database_url, schema, db):
    # Two schemas in one database: a job of each completes in its own.
    other = f"{schema}_b"
    from pgqueue import migrate

    migrate(database_url, other)
    second = Queue.connect(database_url, schema=other)
    try:
        first_queue = Queue.connect(database_url, schema=schema)
        try:
            a = claim_one(first_queue)
            b = claim_one(second)
            assert a.id == b.id  # the same id, in two schemas
            assert a.effect_key("x") != b.effect_key("x")
            with psycopg.connect(database_url) as conn:
                b.complete(conn, "b")
            assert second.get(b.id).state is JobState.SUCCEEDED
            assert first_queue.get(a.id).state is JobState.RUNNING
        finally:
            first_queue.close()
    finally:
        second.close()
        db.execute(f"DROP SCHEMA {other} CASCADE")


def test_effect_keys_are_stable_across_attempts_and_distinct_between_jobs_and_names(queue, db):
    protocol = WorkerProtocol(queue)
    first = claim_one(queue)
    key = first.effect_key("charge")
    assert len(key) == 36 and key.isascii()
    assert first.effect_key("charge") == key
    assert first.effect_key("refund") != key
    protocol.fail(first, "try again")
    db.execute(f"UPDATE {queue.schema}.active_jobs SET run_at = now()")
    (second,) = claim(queue)
    assert second.id == first.id and second.attempts == 2
    assert second.effect_key("charge") == key
    queue.enqueue("t")
    (other,) = claim(queue)
    assert other.effect_key("charge") != key
    # The same job read by a session in another time zone: the same instant, the
    # same key.
    elsewhere = Job.from_fields(
        {**other.__dict__, "enqueued_at": other.enqueued_at.astimezone(KATHMANDU)}
    )
    assert elsewhere.enqueued_at.utcoffset() != other.enqueued_at.utcoffset()
    assert elsewhere.effect_key("charge") == other.effect_key("charge")
    with pytest.raises(ValidationError, match="name"):
        second.effect_key("")


def test_fence_blocks_the_reaper_and_cancels_while_the_heartbeat_extends_the_lease(
    queue, database_url, db, app_table
):
    protocol = WorkerProtocol(queue)
    job = claim_one(queue, lease_seconds=0.5)
    lease = Lease(job.id, job.lease_token)  # type: ignore[arg-type]
    with psycopg.connect(database_url) as conn:
        job.fence(conn)
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'fenced')", (job.id,))
        time.sleep(0.8)  # past the lease
        # The reaper passes the fenced job by, expired as it is.
        assert protocol.reap() == []
        assert queue.get(job.id).state is JobState.RUNNING
        # The heartbeat does not wait, and extends the lease.
        started = time.monotonic()
        assert protocol.heartbeat([lease], lease_seconds=30) == set()
        assert time.monotonic() - started < 2
        left = db.execute(
            f"SELECT lease_expires_at - now() FROM {queue.schema}.active_jobs WHERE id = %s",
            (job.id,),
        ).fetchone()[0]
        assert left > timedelta(seconds=20)
        # A cancel waits for the fencing transaction.
        cancelled = threading.Event()
        refused: list[InvalidTransition] = []

        def cancel() -> None:
            try:
                queue.cancel(job.id)
            except InvalidTransition as exc:
                refused.append(exc)
            cancelled.set()

        canceller = threading.Thread(target=cancel)
        canceller.start()
        assert not cancelled.wait(0.5)
        job.complete(conn, "fenced and done")
    canceller.join(30)
    # The cancel came after the completion had committed: nothing left to cancel.
    assert [exc.state for exc in refused] == ["succeeded"]
    assert queue.get(job.id).state is JobState.SUCCEEDED
    assert rows(db, app_table) == [(job.id, "fenced")]


def test_fence_after_the_lease_was_lost_fails_the_transaction(queue, database_url, db, app_table):
    job = claim_one(queue)
    queue.cancel(job.id)
    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'x')", (job.id,))
        with pytest.raises(LeaseLost):
            job.fence(conn)
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INERROR
    assert rows(db, app_table) == []


def test_fence_refuses_an_autocommit_connection_outside_a_transaction(queue, database_url):
    job = claim_one(queue)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(ValidationError, match="autocommit"):
            job.fence(conn)
        with conn.transaction():
            job.fence(conn)


def test_a_stale_fence_waits_out_a_reap_in_progress_and_then_fails(queue, database_url, db):
    # The reaper holds the row (FOR UPDATE) while it reaps: the fence waits for it,
    # then finds the lease gone.
    job = claim_one(queue, lease_seconds=0.2)
    time.sleep(0.4)
    with psycopg.connect(database_url) as reaper:
        reaper.execute(
            f"SELECT id FROM {queue.schema}.active_jobs WHERE id = %s FOR UPDATE", (job.id,)
        )
        reaper.execute(
            f"UPDATE {queue.schema}.active_jobs SET state = 'queued', lease_token = NULL "
            "WHERE id = %s",
            (job.id,),
        )
        outcome: list[BaseException] = []

        def fence() -> None:
            with psycopg.connect(database_url) as conn:
                try:
                    job.fence(conn)
                except LeaseLost as exc:
                    outcome.append(exc)

        fencing = threading.Thread(target=fence)
        fencing.start()
        time.sleep(0.3)
        assert not outcome
    fencing.join(30)
    assert len(outcome) == 1


def test_complete_and_fence_on_an_async_connection(queue, database_url, db, app_table):
    job = claim_one(queue)
    gone = claim_one(queue)
    queue.cancel(gone.id)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await job.fence(conn)
            await conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'async')", (job.id,))
            await job.complete(conn, {"async": True})
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await conn.execute(f"INSERT INTO {app_table} VALUES (%s, 'lost')", (gone.id,))
            with pytest.raises(LeaseLost):
                await gone.complete(conn)
            await conn.rollback()
            with pytest.raises(LeaseLost):
                await gone.fence(conn)

    asyncio.run(main())
    assert queue.get(job.id).result == {"async": True}
    assert rows(db, app_table) == [(job.id, "async")]


def test_dependents_of_a_job_completed_in_a_transaction_are_released(queue, database_url):
    parent = queue.enqueue("t").job
    child = queue.enqueue("t", depends_on=[parent.id]).job
    assert child.state is JobState.WAITING
    (claimed,) = claim(queue)
    assert claimed.id == parent.id
    with psycopg.connect(database_url) as conn:
        claimed.complete(conn)
    assert queue.get(child.id).state is JobState.QUEUED


def test_only_the_finished_row_proves_a_commit(queue, database_url, db, app_table):
    # After a crash or a failover, a transaction id that never reached the WAL is given
    # out again: the status of a completion's transaction id may then be another
    # transaction's. A running job whose recorded completion names an unrelated
    # committed transaction, or one that was never given out, is not taken for done.
    job = claim_one(queue)
    unrelated = db.execute(
        f"INSERT INTO {app_table} VALUES (0, 'unrelated') RETURNING pg_current_xact_id()::text"
    ).fetchone()[0]
    future = str(int(unrelated) + 1_000_000)
    protocol = WorkerProtocol(queue)
    for xact in (unrelated, future):
        job.__dict__["_completions"] = [
            effects.Completion("never", xact, str(int(xact) & 0xFFFFFFFF))
        ]
        (check,) = protocol.check_completions([job])
        assert check.state is CompletionState.NOT_COMMITTED, xact
    assert queue.get(job.id).state is JobState.RUNNING


def test_an_open_completing_transaction_holds_up_no_other_ack(queue, database_url):
    # A handler stalled between complete and its commit holds what an ack holds, the
    # counter and histogram rows of one slot among them: the acks of other jobs of the
    # same queue and task, from every other session, take other slots.
    protocol = WorkerProtocol(queue)
    for _ in range(9):
        queue.enqueue("t")
    first, *others = claim(queue, 9)
    with psycopg.connect(database_url) as stalled:
        first.complete(stalled, "later")
        acked: list[Job] = []

        def ack_each() -> None:
            # Half acked by the worker's statement, half completed in transactions of
            # their own, each on a session of its own.
            for number, job in enumerate(others):
                if number % 2:
                    protocol.ack(job, "now")
                else:
                    with psycopg.connect(database_url) as conn:
                        job.complete(conn, "now")
                acked.append(job)

        acking = threading.Thread(target=ack_each)
        acking.start()
        acking.join(30)
        assert len(acked) == 8, "an ack waited for the open completing transaction"
    assert {queue.get(job.id).state for job in [first, *others]} == {JobState.SUCCEEDED}
