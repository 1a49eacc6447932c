"""Every step of fair share's walk over partition keys (``lane_after``) reads a handful of
index pages, however many jobs are queued behind the keys it passes.

Each step is run as the claim runs it: a prepared statement with its generic plan, so
its arguments are parameters, not constants the planner could fold away. What is
counted is buffers, not time: the same on a loaded machine. Migration 0013 is what
makes these hold. Before it, two conditions that mixed a test of an argument with one
of the row ("NOT wrapped OR key <= turn", "priority IS NULL OR priority < priority")
were filters of the index scan, so the walk's last step on a first claim, and a wrapped
step at the turn, read the queued jobs of every key (20,000 and 30,000 buffers here,
where each step now reads 4 to 6)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobSpec, Queue

KEYS = 100
JOBS_PER_KEY = 200
# A step descends the claim index a few times, a few pages each; reading the backlog
# behind 100 keys is about as many buffers as there are jobs.
MOST_BUFFERS_PER_STEP = 100


@pytest.fixture
def keyed_backlog(queue: Queue) -> None:
    """20,000 queued jobs of one queue and task, 200 for each of 100 keys."""
    specs = [
        JobSpec("t", queue="q", partition_key=f"k{key:02}")
        for _ in range(JOBS_PER_KEY)
        for key in range(KEYS)
    ]
    queue.enqueue_many(specs)


def step_buffers(db: psycopg.Connection, schema: str, *args: Any) -> tuple[int, list[Any]]:
    """The buffers one generic-plan call of lane_after(queue, task, turn, priority,
    partition_key, wrapped) reads, and the lane it returns."""
    db.execute("SET plan_cache_mode = force_generic_plan")
    db.execute(
        f"PREPARE walk_step(text, text, text, smallint, text, boolean) AS"
        f" SELECT lane_priority, lane_key, lane_wrapped"
        f" FROM {schema}.lane_after($1, $2, $3, $4, $5, $6)"
    )
    try:
        execute = sql.SQL("EXECUTE walk_step({})").format(
            sql.SQL(", ").join(sql.Literal(arg) for arg in args)
        )
        row = db.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + execute).fetchone()
        assert row is not None
        plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
        top = plan[0]["Plan"]
        lane = db.execute(execute).fetchall()
    finally:
        db.execute("DEALLOCATE walk_step")
        db.execute("RESET plan_cache_mode")
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"], [list(r) for r in lane]


@pytest.mark.usefixtures("keyed_backlog")
@pytest.mark.parametrize(
    ("step", "args", "lane"),
    [
        ("the first step", ("q", "t", None, None, None, False), [0, "k00", False]),
        ("a middle step", ("q", "t", None, 0, "k41", False), [0, "k42", False]),
        # A first claim has no turn to wrap to: the walk looks for a lower priority.
        ("the last step of a first claim", ("q", "t", None, 0, "k99", False), []),
        ("the last step before wrapping", ("q", "t", "k50", 0, "k99", False), [0, "k00", True]),
        ("a step after wrapping", ("q", "t", "k50", 0, "k20", True), [0, "k21", True]),
        ("the step that reaches the turn", ("q", "t", "k50", 0, "k50", True), []),
    ],
)
def test_a_step_of_the_walk_reads_a_few_pages_beside_a_long_backlog(
    db: psycopg.Connection, schema: str, step: str, args: tuple[Any, ...], lane: list[Any]
) -> None:
    buffers, found = step_buffers(db, schema, *args)
    assert found == ([lane] if lane else [])
    assert buffers <= MOST_BUFFERS_PER_STEP, f"{step} read {buffers} buffers"
