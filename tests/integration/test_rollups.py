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
