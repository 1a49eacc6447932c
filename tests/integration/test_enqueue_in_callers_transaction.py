"""Every enqueue that takes ``conn=`` leaves the caller's transaction as it found it:
on a connection that is idle, the enqueue's statements open the caller's transaction
and leave it open (never a transaction of its own, committed behind the caller's back);
mid-transaction, they join it; in autocommit, the enqueue is its own transaction. The
jobs then exist exactly when the caller committed (or at once, in autocommit)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from pgqueue import BatchItem, EnqueueResult, JobSpec, JobState, Queue
from pgqueue.bulk import COPY_MIN_JOBS

Enqueue = Callable[[Queue, psycopg.Connection, int], list[EnqueueResult]]
"""One kind of enqueue, on ``conn``, of jobs depending on the given job id if it
depends on anything."""


def _plain(queue: Queue, conn: psycopg.Connection, _: int) -> list[EnqueueResult]:
    return [queue.enqueue("t", {"n": 1}, conn=conn)]


def _many_small(queue: Queue, conn: psycopg.Connection, _: int) -> list[EnqueueResult]:
    return queue.enqueue_many([JobSpec("t", {"n": n}) for n in range(3)], conn=conn)


def _many_copied(queue: Queue, conn: psycopg.Connection, _: int) -> list[EnqueueResult]:
    return queue.enqueue_many([JobSpec("t", {"n": n}) for n in range(COPY_MIN_JOBS)], conn=conn)


def _idempotency_key(queue: Queue, conn: psycopg.Connection, _: int) -> list[EnqueueResult]:
    return [queue.enqueue("t", idempotency_key="k", conn=conn)]


def _unique_key(queue: Queue, conn: psycopg.Connection, _: int) -> list[EnqueueResult]:
    return [queue.enqueue("t", unique_key="u", conn=conn)]


def _dependent(queue: Queue, conn: psycopg.Connection, dependency: int) -> list[EnqueueResult]:
    return [queue.enqueue("child", depends_on=[dependency], conn=conn)]


def _dependent_batch_item(
    queue: Queue, conn: psycopg.Connection, dependency: int
) -> list[EnqueueResult]:
    return queue.enqueue_many(
        [JobSpec("parent"), JobSpec("child", depends_on=[BatchItem(0), dependency])], conn=conn
    )


ENQUEUES: dict[str, Enqueue] = {
    "plain": _plain,
    "many-small": _many_small,
    "many-copied": _many_copied,
    "idempotency-key": _idempotency_key,
    "unique-key": _unique_key,
    "dependent": _dependent,
    "dependent-batch-item": _dependent_batch_item,
}


def _existing(db: psycopg.Connection, schema: str, ids: list[int]) -> list[int]:
    rows = db.execute(f"SELECT id FROM {schema}.jobs WHERE id = ANY(%s) ORDER BY id", (ids,))
    return [row[0] for row in rows]


@pytest.mark.parametrize("kind", list(ENQUEUES))
@pytest.mark.parametrize("caller", ["idle", "mid-transaction", "autocommit"])
@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_an_enqueue_on_the_callers_connection_commits_only_with_the_caller(
    queue: Queue,
    database_url: str,
    db: psycopg.Connection,
    schema: str,
    kind: str,
    caller: str,
    ending: str,
) -> None:
    dependency = queue.enqueue("first").job  # queued: a dependent of it waits
    with psycopg.connect(database_url, autocommit=caller == "autocommit") as conn:
        if caller == "mid-transaction":
            conn.execute("SELECT 1")  # the caller's transaction, which the enqueue joins
        before = conn.info.transaction_status

        results = ENQUEUES[kind](queue, conn, dependency.id)

        ids = [result.job.id for result in results]
        assert all(result.created for result in results)
        if caller == "autocommit":
            assert conn.info.transaction_status is TransactionStatus.IDLE
        else:
            # Still the caller's transaction, open, for the caller to end.
            assert conn.info.transaction_status is TransactionStatus.INTRANS, before
            # Nobody else sees the jobs before the caller commits.
            assert _existing(db, schema, ids) == []
        if ending == "commit":
            conn.commit()
        else:
            conn.rollback()

    if caller == "autocommit" or ending == "commit":
        assert _existing(db, schema, ids) == sorted(ids)
        if kind.startswith("dependent"):
            child = queue.get(ids[-1])
            assert child.state is JobState.WAITING
            assert queue.dependencies(dependency.id).dependents == [child.id]
    else:
        assert _existing(db, schema, ids) == []
        assert queue.dependencies(dependency.id).dependents == []
