"""pytest-pgqueue's ``pgqueue_claim``: a job claimed as a worker would, for calling a
handler that completes it in its own transaction straight from a test."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgqueue import Job, JobState, LeaseLost, PgQueueError, Queue


def charge(payload: dict[str, Any], job: Job) -> None:
    """A handler as an application would write it: its row and the job's completion
    in one transaction on a connection the worker lends."""
    with job.transaction() as conn:
        conn.execute(
            f"INSERT INTO {payload['table']} (job_id, key) VALUES (%s, %s)",
            (job.id, job.effect_key("charge")),
        )
        job.set_result({"charged": payload["amount"]})


async def acharge(payload: dict[str, Any], job: Job) -> None:
    async with job.atransaction() as conn:
        await conn.execute(
            f"INSERT INTO {payload['table']} (job_id, key) VALUES (%s, %s)",
            (job.id, job.effect_key("charge")),
        )
        job.set_result({"charged": payload["amount"]})


@pytest.fixture
def table(db: psycopg.Connection, schema: str) -> str:
    db.execute(f"CREATE TABLE {schema}.charges (job_id bigint, key text)")
    return f"{schema}.charges"


def test_a_claimed_job_completes_in_the_handlers_transaction(
    pgqueue_claim, pgqueue_queue: Queue, db, table
) -> None:
    job = pgqueue_claim("charge", {"table": table, "amount": 5})
    assert job.state is JobState.RUNNING and job.lease_token is not None
    charge(job.payload, job)
    done = pgqueue_queue.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.result == {"charged": 5}
    assert db.execute(f"SELECT job_id, key FROM {table}").fetchall() == [
        (job.id, job.effect_key("charge"))
    ]


def test_an_async_handler_too(pgqueue_claim, pgqueue_queue: Queue, db, table) -> None:
    first = pgqueue_claim("charge", {"table": table, "amount": 1})
    second = pgqueue_claim("charge", {"table": table, "amount": 2})
    asyncio.run(acharge(first.payload, first))
    asyncio.run(acharge(second.payload, second))  # another event loop: still lends
    assert [pgqueue_queue.get(j.id).result for j in (first, second)] == [
        {"charged": 1},
        {"charged": 2},
    ]


def test_a_cancelled_claim_shows_what_the_handler_does_once_its_lease_is_lost(
    pgqueue_claim, pgqueue_queue: Queue, db, table
) -> None:
    job = pgqueue_claim("charge", {"table": table, "amount": 5})
    pgqueue_queue.cancel(job.id)
    with pytest.raises(LeaseLost):
        charge(job.payload, job)
    assert pgqueue_queue.get(job.id).state is JobState.CANCELLED
    assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_a_job_that_is_not_runnable_or_not_first_is_refused_clearly(
    pgqueue_claim, pgqueue_queue: Queue
) -> None:
    with pytest.raises(PgQueueError, match="is not runnable now"):
        pgqueue_claim("later", {}, delay_seconds=3600)
    pgqueue_queue.enqueue("busy", {})
    with pytest.raises(PgQueueError, match="was claimed first"):
        pgqueue_claim("busy", {})
