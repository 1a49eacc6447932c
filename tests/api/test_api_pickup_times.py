"""/metrics' pickup histogram, ``pgqueue_enqueue_to_start_seconds{queue}``: one
observation per attempt started, by any worker, of how long its job had been runnable
(since the later of its enqueue and its run_at, which a retry moves), read from the
database and parsed with prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest
from polling import wait_for
from processes import environment, start_worker, stop
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from pgqueue import JobSpec, JobState, Queue, WorkerProtocol

PICKUP = "pgqueue_enqueue_to_start_seconds"
HERE = Path(__file__).resolve().parent
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(api: httpx.Client) -> Samples:
    response = api.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _buckets(samples: Samples, queue: str) -> dict[str, float]:
    """The cumulative bucket counts of ``queue``'s series, by ``le``."""
    return {
        dict(labels)["le"]: value
        for (name, labels), value in samples.items()
        if name == f"{PICKUP}_bucket" and dict(labels)["queue"] == queue
    }


def _count(samples: Samples, queue: str) -> float:
    return samples[(f"{PICKUP}_count", (("queue", queue),))]


def _sum(samples: Samples, queue: str) -> float:
    return samples[(f"{PICKUP}_sum", (("queue", queue),))]


def _assert_consistent(samples: Samples) -> None:
    """Every queue's series has the same bounds, counts that never go down as the bound
    grows, and a +Inf bucket equal to its count."""
    queues = {
        dict(labels)["queue"] for (name, labels), _ in samples.items() if name.startswith(PICKUP)
    }
    assert queues
    bounds = None
    for queue in queues:
        buckets = _buckets(samples, queue)
        ordered = sorted(buckets, key=float)
        assert bounds is None or ordered == bounds, queue
        bounds = ordered
        counts = [buckets[le] for le in ordered]
        assert counts == sorted(counts), (queue, buckets)
        assert ordered[-1] == "+Inf" and counts[-1] == _count(samples, queue)


def _waited(db: psycopg.Connection, schema: str, job_id: int, enqueued: float, run_at: float):
    """Make job ``job_id`` look enqueued ``enqueued`` seconds ago, runnable from
    ``run_at`` seconds ago."""
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET enqueued_at = now() - make_interval(secs => %s), "
            "run_at = now() - make_interval(secs => %s) WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (enqueued, run_at, job_id),
    )


def test_every_attempt_started_is_one_observation_in_the_bucket_of_its_wait(
    api: httpx.Client, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    first, second = WorkerProtocol(queue), WorkerProtocol(queue)
    late, retried, early = (queue.enqueue("echo", queue="mail").job.id for _ in range(3))
    image = queue.enqueue("echo", queue="images").job.id
    _waited(db, schema, late, enqueued=40, run_at=40)  # 40 s
    _waited(db, schema, retried, enqueued=100, run_at=2)  # 2 s: runnable from run_at
    _waited(db, schema, early, enqueued=7, run_at=100)  # 7 s: runnable from its enqueue
    _waited(db, schema, image, enqueued=20, run_at=20)  # 20 s

    # Two workers start the four attempts; none has finished when it is scraped.
    mail = first.claim(["mail"], ["echo"], limit=3, worker_id="first")
    [image_job] = second.claim(["images"], ["echo"], worker_id="second")
    samples = _scrape(api)
    _assert_consistent(samples)
    assert _count(samples, "mail") == 3
    assert _buckets(samples, "mail") == {
        **dict.fromkeys(["0.001", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25"], 0),
        **dict.fromkeys(["0.5", "1.0"], 0),
        "2.5": 1,
        "5.0": 1,
        "10.0": 2,
        "30.0": 2,
        "60.0": 3,
        "300.0": 3,
        "900.0": 3,
        "3600.0": 3,
        "+Inf": 3,
    }
    assert 49 <= _sum(samples, "mail") < 55
    assert _buckets(samples, "images")["10.0"] == 0
    assert _buckets(samples, "images")["30.0"] == _count(samples, "images") == 1

    # The attempts end every way there is: acked, failed (to run again), cancelled
    # while running, reaped after their lease expired. Each still counts once.
    by_id = {job.id: job for job in mail}
    first.ack(by_id[late], None)
    first.fail(by_id[retried], "boom")
    assert api.post(f"/jobs/{early}/cancel").status_code == 200
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (image_job.id,),
    )
    assert [job.id for job in second.reap() or []] == [image_job.id]
    samples = _scrape(api)
    _assert_consistent(samples)
    assert (_count(samples, "mail"), _count(samples, "images")) == (3, 1)

    # The retried job's second attempt: 5 s after its retry made it runnable.
    assert queue.get(retried).state is JobState.QUEUED
    _waited(db, schema, retried, enqueued=100, run_at=5)
    [again] = second.claim(["mail"], ["echo"], worker_id="second")
    assert (again.id, again.attempts) == (retried, 2)
    second.ack(again, None)
    samples = _scrape(api)
    _assert_consistent(samples)
    mail_buckets = _buckets(samples, "mail")
    assert _count(samples, "mail") == 4
    assert (mail_buckets["2.5"], mail_buckets["5.0"], mail_buckets["10.0"]) == (1, 1, 3)
    assert mail_buckets["60.0"] == 4
    assert 54 <= _sum(samples, "mail") < 61

    # Counted as attempts start and end, not read from the history: pruning leaves it.
    assert queue.prune(0) == 3
    assert _count(_scrape(api), "mail") == 4


def test_attempts_of_real_workers_are_each_counted_once(
    api: httpx.Client, queue: Queue, database_url: str, schema: str, tmp_path: Path
) -> None:
    """Two worker processes run jobs that each fail once before they succeed: every
    attempt, the failed ones too, is one observation."""
    args = [
        "--database-url", database_url, "--schema", schema, "--queue", "mail,images",
        "--retry-base", "0.05", "--retry-cap", "0.1", "--poll-interval", "0.2",
    ]  # fmt: skip
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    workers = [start_worker(args, environment(HERE), log) for log in logs]
    try:

        def running(wanted: Callable[[], bool]) -> Callable[[], bool]:
            def check() -> bool:
                for worker, log in zip(workers, logs, strict=True):
                    assert worker.poll() is None, log.read_text()
                return wanted()

            return check

        # Both serve before the jobs come, so that both take some.
        wait_for(
            running(lambda: all(" serving queue" in log.read_text() for log in logs)),
            120,
            what="both workers to serve",
        )
        queue.enqueue_many(
            [JobSpec("flaky", {"fail_times": 1}, queue="mail", max_attempts=3) for _ in range(20)]
            + [JobSpec("echo", {}, queue="images") for _ in range(10)]
        )

        def all_succeeded() -> bool:
            counts = [s.counts[JobState.SUCCEEDED.value] for s in queue.stats()]
            return sum(counts) == 30

        wait_for(running(all_succeeded), 120, what="every job to succeed")
    finally:
        assert stop(workers) == [0, 0]
    samples = _scrape(api)
    _assert_consistent(samples)
    assert (_count(samples, "mail"), _count(samples, "images")) == (40, 10)
    assert _sum(samples, "mail") > 0


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [(0.0, "0.001"), (0.001, "0.001"), (0.0011, "0.005"), (1.0, "1.0"), (3600.0, "3600.0"),
     (3600.5, "+Inf")],
)  # fmt: skip
def test_a_wait_on_a_bound_falls_in_that_bound(
    api: httpx.Client,
    queue: Queue,
    db: psycopg.Connection,
    schema: str,
    seconds: float,
    bucket: str,
) -> None:
    """Prometheus buckets hold what is at or below their bound: while the attempt runs,
    and once it ended."""
    queue.enqueue("echo")
    protocol = WorkerProtocol(queue)
    [claimed] = protocol.claim(["default"], ["echo"])
    # Runnable exactly `seconds` before the claim.
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET enqueued_at = started_at - make_interval(secs => %s), "
            "run_at = started_at - make_interval(secs => %s) WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (seconds, seconds, claimed.id),
    )

    def lowest_bucket_holding_it() -> str:
        buckets = _buckets(_scrape(api), "default")
        assert buckets["+Inf"] == 1
        return min((le for le, count in buckets.items() if count == 1), key=float)

    assert lowest_bucket_holding_it() == bucket
    protocol.ack(claimed, None)
    assert lowest_bucket_holding_it() == bucket
