"""The start-latency histogram the jobs table's triggers keep: each claim's wait lands
in the bucket of the smallest bound at or above it, a bound itself included."""

from __future__ import annotations

import psycopg
import pytest

from pgqueue import Queue

# (wait in seconds, the bucket it belongs to): below the first bound, on a bound,
# just past one, past the last finite bound.
WAITS = [(0.0, 0.005), (0.005, 0.005), (0.0051, 0.01), (2.5, 2.5), (2.6, 5.0), (7200.0, None)]


@pytest.mark.parametrize(("wait", "bucket"), WAITS)
def test_a_claims_wait_lands_in_the_smallest_bucket_at_or_above_it(
    queue: Queue, database_url: str, schema: str, wait: float, bucket: float | None
) -> None:
    job = queue.enqueue("echo", {}).job
    with psycopg.connect(database_url) as conn:
        # One transaction, so now() is the same instant in both statements: the wait is
        # exactly ``wait`` seconds, as a claim's started_at = now() would measure it.
        conn.execute(
            f"UPDATE {schema}.jobs SET enqueued_at = now() - make_interval(secs => %s),"
            " run_at = now() - make_interval(secs => %s) WHERE id = %s",
            (wait, wait, job.id),
        )
        conn.execute(
            f"UPDATE {schema}.jobs SET state = 'running', started_at = now() WHERE id = %s",
            (job.id,),
        )

    snapshot = queue.metrics_snapshot()
    [metrics] = snapshot.queues
    counts = dict(zip(snapshot.start_bounds, metrics.start_counts, strict=True))
    expected = float("inf") if bucket is None else bucket
    assert {bound: n for bound, n in counts.items() if n} == {expected: 1}
    assert metrics.start_seconds_sum == pytest.approx(wait)


def _rollups(queue: Queue) -> dict[str, dict]:
    """Each queue's gauges, counters and number of claims, as the rollups tell them."""
    return {
        m.queue: {
            "jobs": {state: n for state, n in m.jobs.items() if n},
            "completed": m.completed,
            "failures": m.failures,
            "starts": sum(m.start_counts),
        }
        for m in queue.metrics_snapshot().queues
    }


def _counted(db: psycopg.Connection, schema: str) -> dict[str, dict[str, int]]:
    """Jobs per queue and state, counted in the jobs table itself."""
    counted: dict[str, dict[str, int]] = {}
    for name, state, n in db.execute(
        f"SELECT queue, state::text, count(*) FROM {schema}.jobs GROUP BY 1, 2"
    ).fetchall():
        counted.setdefault(name, {})[state] = n
    return counted


def test_rollups_stay_exact_through_statements_that_mix_states_and_queues(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    """Claims, acks and failures move rows that were all in one state; a hand-written
    UPDATE can move rows from several states at once, and between queues. Either way,
    gauges match the table, and only attempts that were running count as ended."""
    ids = [queue.enqueue("echo", {"n": n}, queue="a").job.id for n in range(8)]
    claimed = queue.claim(["a"], ["echo"], limit=5)  # every row queued: 5 claims
    queue.ack_many([(job, None) for job in claimed[:2]])  # every row running: 2 completed
    queue.fail(claimed[2], "boom")  # 1 failure, back to queued
    running = [job.id for job in claimed[3:]]
    queued = [i for i in ids if i not in {job.id for job in claimed[:3]} | set(running)]

    def update(sql_text: str, rows: list[int]) -> None:
        db.execute(sql_text.format(schema=schema), (rows,))

    # One running row succeeds while one queued row starts: 1 completed, 1 claim.
    update(
        "UPDATE {schema}.jobs SET state = CASE WHEN state = 'running' THEN 'succeeded'"
        " ELSE 'running' END::{schema}.job_state, started_at = now() WHERE id = ANY(%s)",
        [running[0], queued[0]],
    )
    # One running row goes back to queued in queue b, a queued one moves to b: 1 failure.
    update(
        "UPDATE {schema}.jobs SET queue = 'b', state = 'queued' WHERE id = ANY(%s)",
        [running[1], queued[1]],
    )
    # A running row and a queued row are cancelled: a cancel is not a failure.
    update(
        "UPDATE {schema}.jobs SET state = 'cancelled' WHERE id = ANY(%s)",
        [queued[0], queued[2]],
    )
    # Rows that stay where they are change nothing.
    update("UPDATE {schema}.jobs SET priority = 1 WHERE id = ANY(%s)", ids)

    rollups = _rollups(queue)
    assert {name: figures["jobs"] for name, figures in rollups.items()} == _counted(db, schema)
    assert rollups["a"] | {"jobs": None} == {
        "jobs": None,
        "completed": 3,
        "failures": 1,
        "starts": 6,
    }
    assert rollups["b"] | {"jobs": None} == {
        "jobs": None,
        "completed": 0,
        "failures": 1,
        "starts": 0,
    }
