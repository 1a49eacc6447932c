"""The history's coming days: made however pruning is configured, and never by reading a
large DEFAULT partition under a lock that acks wait for, while real workers ack."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from lock_watch import LockedReads
from polling import wait_for
from processes import environment, pgqueue_command, start_worker, stop
from psycopg import sql

from pgqueue import JobSpec, JobState, Queue, history
from pgqueue.job import FINISHED_STATES
from pgqueue.locks import advisory_key

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow


def _worker_args(database_url: str, schema: str, *flags: str) -> list[str]:
    return [
        "--database-url",
        database_url,
        "--schema",
        schema,
        "--no-plugin-autoload",
        "--handlers",
        "scale_handlers:HANDLERS",
        "--poll-interval",
        "0.2",
        *flags,
    ]


def _count(db: psycopg.Connection, schema: str, table: str, where: str = "true") -> int:
    return db.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(sql.Identifier(schema, table))
    ).fetchone()[0]


def _drop_days(db: psycopg.Connection, schema: str, *, since: int) -> list[history.Day]:
    """Drop every day from ``since`` days ahead of today on, as if none had been made."""
    existing, today, _ = history.days(db, schema)
    dropped = [day for day in existing if day.day >= today + timedelta(days=since)]
    for day in dropped:
        db.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, day.name)))
    return dropped


def _coming_days(db: psycopg.Connection, schema: str) -> set[history.Day]:
    existing, today, _ = history.days(db, schema)
    wanted = {
        history.Day(state, today + timedelta(days=n))
        for state in FINISHED_STATES
        for n in range(history.DAYS_AHEAD)
    }
    return wanted & set(existing)


def _all_coming_days(db: psycopg.Connection, schema: str) -> set[history.Day]:
    return {
        history.Day(state, history.days(db, schema)[1] + timedelta(days=n))
        for state in FINISHED_STATES
        for n in range(history.DAYS_AHEAD)
    }


def _acked(db: psycopg.Connection, schema: str) -> int:
    return _count(db, schema, "finished_jobs", "task = 'nap'")


FILL = """
INSERT INTO {schema}.finished_jobs (id, queue, task, payload, priority, state, run_at,
                                    attempts, max_attempts, enqueued_at, finished_at)
SELECT nextval('{schema}.job_ids'), 'old', 't', jsonb_build_object('n', n), 0, 'succeeded',
       now(), 1, 5, now(), {finished_at}
FROM generate_series(1, %(count)s) AS n
"""

JOBS = 10_000
TODAY_ROWS = 40_000
LATER_ROWS = 20_000


def test_days_are_made_beside_a_full_default_partition_while_workers_ack(
    queue: Queue, db, schema, database_url, tmp_path
):
    """No day was made for a while: the DEFAULT partition holds tens of thousands of
    today's jobs, and jobs of the day after tomorrow written by hand. The days are made
    while two workers ack into the history."""
    _drop_days(db, schema, since=0)
    today = history.days(db, schema)[1]
    later = today + timedelta(days=2)
    fill = sql.SQL(FILL)
    db.execute(
        fill.format(schema=sql.Identifier(schema), finished_at=sql.SQL("now()")),
        {"count": TODAY_ROWS},
    )
    db.execute(
        fill.format(
            schema=sql.Identifier(schema),
            finished_at=sql.Literal(f"{later.isoformat()} 12:00+00"),
        ),
        {"count": LATER_ROWS},
    )
    # Two workers of 32 slots take some seconds over these.
    queue.enqueue_many(JobSpec("nap", {"seconds": 0.05}) for _ in range(JOBS))
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    with psycopg.connect(database_url, autocommit=True) as holder:
        # The workers' own day makers wait: this test makes the days, on a connection
        # that watches what it reads under which lock.
        holder.execute("SELECT pg_advisory_lock(%s)", (advisory_key("prune", schema),))
        workers = [
            start_worker(_worker_args(database_url, schema), environment(HERE), log) for log in logs
        ]
        try:
            wait_for(lambda: _acked(db, schema) > 0, what="the workers' first acks")
            acked_before = _acked(db, schema)
            with LockedReads.connect(database_url, autocommit=True) as watched:
                made = history.create_days(watched.watch(schema), schema)
            acked_after = _acked(db, schema)
            wait_for(lambda: _acked(db, schema) == JOBS, what="the workers to finish every job")
        finally:
            exit_codes = stop(workers)
    output = "\n".join(log.read_text() for log in logs)

    # Nothing read a DEFAULT partition under a lock that acks wait for.
    assert watched.found == []
    assert acked_before < acked_after < JOBS, "no ack came while the days were made"
    # Every day is made but today's succeeded one, which began beside a large DEFAULT.
    today_succeeded = history.Day(JobState.SUCCEEDED, today)
    assert _coming_days(db, schema) == _all_coming_days(db, schema) - {today_succeeded}
    assert list(made.left) == [today_succeeded.name]
    # Every job is where its day says: the hand-written ones in their day, today's in
    # DEFAULT, beside every job the workers acked; none lost, none refused.
    later_day = history.Day(JobState.SUCCEEDED, later)
    assert _count(db, schema, later_day.name) == LATER_ROWS
    default = history.default_partition(JobState.SUCCEEDED)
    assert _count(db, schema, default) == TODAY_ROWS + JOBS
    assert _count(db, schema, "finished_jobs", "task = 'nap' AND state = 'succeeded'") == JOBS
    assert _count(db, schema, "active_jobs") == 0
    # No statement of the workers ran into their deadline, nor failed.
    assert "took longer than" not in output
    assert "Traceback" not in output
    assert exit_codes == [0, 0], output


@pytest.mark.parametrize(
    "flags",
    [
        (
            "--prune-succeeded-after",
            "0",
            "--prune-cancelled-after",
            "0",
            "--prune-dead-after",
            "0",
        ),
        ("--prune-interval", "0"),
    ],
    ids=["every-retention-0", "prune-interval-0"],
)
def test_a_worker_makes_the_coming_days_however_pruning_is_configured(
    db, schema, database_url, tmp_path, flags
):
    dropped = _drop_days(db, schema, since=1)
    assert len(dropped) == 6
    log = tmp_path / "worker.log"
    worker = start_worker(_worker_args(database_url, schema, *flags), environment(HERE), log)
    try:
        wait_for(
            lambda: _coming_days(db, schema) == _all_coming_days(db, schema),
            what=f"the coming days; log:\n{log.read_text()}",
        )
    finally:
        (exit_code,) = stop([worker])
    assert "created the history's days" in log.read_text()
    assert exit_code == 0, log.read_text()


def test_pgqueue_prune_makes_the_coming_days(db, schema, database_url):
    _drop_days(db, schema, since=1)
    done = subprocess.run(
        [
            *pgqueue_command(),
            "prune",
            "--older-than",
            "7d",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert _coming_days(db, schema) == _all_coming_days(db, schema)
    assert "created the history's days" in done.stdout
    assert "pruned 0 jobs" in done.stdout
