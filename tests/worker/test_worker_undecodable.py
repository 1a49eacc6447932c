"""A row whose payload Python cannot load, written around pgqueue (by another client, an
older version or by hand), fails only itself under a real ``pgqueue worker``: the jobs
claimed with it run, and expired leases around it are still reaped."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from worker_support import FAST

from pgqueue import JobState, Queue

pytestmark = pytest.mark.slow


def _insert(db: psycopg.Connection, schema: str, payload: str, **columns: object) -> int:
    names = ["queue", "task", "payload", *columns]
    values = ["default", "echo", payload, *columns.values()]
    row = db.execute(
        sql.SQL("INSERT INTO {}.active_jobs ({}) VALUES ({}) RETURNING id").format(
            sql.Identifier(schema),
            sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(sql.Placeholder() * len(values)),
        ),
        values,
    ).fetchone()
    assert row is not None
    return row[0]


def test_a_burst_worker_fails_the_poison_job_and_runs_and_reaps_every_other(
    start_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    # As reported: PostgreSQL prints 1e5000 as 5,001 digits, Python refuses to convert
    # them, and the claim that took this row with three others had already committed.
    poison = _insert(db, schema, '{"n": 1e5000}', max_attempts=1)
    normal = [queue.enqueue("echo", {"n": n}).job.id for n in range(3)]
    # Workers that vanished holding a poison job and a normal one: expired, oldest first.
    vanished = {
        name: _insert(
            db,
            schema,
            payload,
            state="running",
            attempts=1,
            max_attempts=max_attempts,
            lease_token=uuid.uuid4(),
            worker_id="vanished:1:0",
        )
        for name, payload, max_attempts in (
            ("poison", '{"n": 1e5000}', 1),
            ("normal", '{"n": 9}', 2),
        )
    }
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET lease_expires_at = now() - interval '1 minute' "
            "WHERE state = 'running'"
        ).format(sql.Identifier(schema))
    )

    # The long backoff keeps the reaped normal job queued: the outcome does not depend
    # on whether the burst looks again before it is due.
    worker = start_worker("--burst", *FAST, "--retry-base", "3600", "--retry-cap", "3600")
    assert worker.wait() == 0, worker.log()

    assert [queue.get(job_id).state for job_id in normal] == [JobState.SUCCEEDED] * 3
    reason = "payload could not be decoded: a number with more than 4300 digits"
    for job_id in (poison, vanished["poison"]):
        job = queue.get(job_id)
        assert (job.state, job.attempts) == (JobState.DEAD, 1), job
        assert job.last_error.startswith(reason)
    assert "lease expired" in queue.get(vanished["poison"]).last_error
    reaped = queue.get(vanished["normal"])
    assert (reaped.state, reaped.attempts) == (JobState.QUEUED, 1)
    assert reaped.last_error.startswith("lease expired")
    assert queue.list(state="running").jobs == []
    assert "claim loop error" not in worker.log() and "Traceback" not in worker.log()
