"""Queues as objects: pause, concurrency and rate limits enforced by the claim, and what
an operator can and cannot set."""

from __future__ import annotations

import math
import threading
import time

import psycopg
import pytest

from pgqueue import (
    UNSET,
    JobSpec,
    Queue,
    QueueInfo,
    QueueNotFound,
    ValidationError,
    Waiter,
    WorkerProtocol,
    queries,
)


def _enqueue(queue: Queue, count: int, name: str = "default", task: str = "t") -> None:
    queue.enqueue_many(JobSpec(task, {"n": n}, queue=name) for n in range(count))


def test_a_paused_queue_accepts_jobs_and_gives_none_until_resumed(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 3)
    assert queue.pause_queue("default") == QueueInfo("default", True, None, None)
    _enqueue(queue, 2)
    assert protocol.claim(["default"], ["t"], limit=10) == []
    assert protocol.next_run_in(["default"], ["t"]) is None  # nothing to wait for
    assert queue.resume_queue("default") == QueueInfo("default", False, None, None)
    assert len(protocol.claim(["default"], ["t"], limit=10)) == 5


def test_a_pause_holds_back_only_its_own_queue(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 2, "a")
    _enqueue(queue, 2, "b")
    queue.pause_queue("a")
    assert {job.queue for job in protocol.claim(["a", "b"], ["t"], limit=10)} == {"b"}


def test_a_concurrency_limit_counts_the_running_jobs_of_every_worker(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 10)
    queue.update_queue("default", concurrency_limit=3)
    assert len(protocol.claim(["default"], ["t"], limit=2, worker_id="a")) == 2
    [second] = protocol.claim(["default"], ["t"], limit=5, worker_id="b")
    assert protocol.claim(["default"], ["t"], limit=5, worker_id="c") == []
    protocol.ack(second)
    assert len(protocol.claim(["default"], ["t"], limit=5, worker_id="c")) == 1
    # Raised, the limit leaves room at once; removed, there is none.
    queue.update_queue("default", concurrency_limit=5)
    assert len(protocol.claim(["default"], ["t"], limit=5)) == 2
    queue.update_queue("default", concurrency_limit=None)
    assert len(protocol.claim(["default"], ["t"], limit=5)) == 4  # the rest


def test_a_concurrency_limit_holds_for_the_jobs_of_every_task_together(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 4, task="a")
    _enqueue(queue, 4, task="b")
    _enqueue(queue, 4, "other", task="a")
    queue.update_queue("default", concurrency_limit=3)
    claimed = protocol.claim(["default", "other"], ["a", "b"], limit=10)
    by_queue = {name: [j for j in claimed if j.queue == name] for name in ("default", "other")}
    assert len(by_queue["default"]) == 3 and len(by_queue["other"]) == 4
    assert protocol.claim(["default"], ["a", "b"], limit=10) == []


def test_a_concurrency_limit_holds_when_many_claims_race(queue: Queue) -> None:
    """Each claim of a limited queue waits for the one before it: forty claims racing
    from eight threads never hold more than the limit between them."""
    _enqueue(queue, 200)
    queue.update_queue("default", concurrency_limit=7)
    start = threading.Barrier(8)
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        protocol = WorkerProtocol(queue)
        start.wait()
        for _ in range(5):
            jobs = protocol.claim(["default"], ["t"], limit=3)
            with lock:
                claimed.extend(job.id for job in jobs)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(claimed) == 7
    running = next(s for s in queue.stats() if s.queue == "default").counts["running"]
    assert running == 7


class _TimedClaims:
    """Claims from one queue and notes, by the test's clock, when each claim was sent
    and when it returned: the server's bucket refills for time between those bounds, so
    what the bucket may give is known however slow the machine is."""

    def __init__(self, queue: Queue) -> None:
        self.protocol = WorkerProtocol(queue)
        self.sent: list[float] = []
        self.returned: list[float] = []
        self.counts: list[int] = []

    def claim(self) -> int:
        self.sent.append(time.monotonic())
        count = len(self.protocol.claim(["default"], ["t"], limit=100))
        self.returned.append(time.monotonic())
        self.counts.append(count)
        return count


def test_a_rate_limit_is_a_token_bucket_of_a_tenth_of_a_second(queue: Queue) -> None:
    rate, bucket = 50, 5  # a tenth of a second's worth
    claims = _TimedClaims(queue)
    _enqueue(queue, 500)  # more than a slow machine's claims can take
    queue.update_queue("default", rate_limit=rate)  # a new rate starts from an empty bucket
    time.sleep(0.3)
    # Full after an idle spell: a burst of a tenth of a second's worth, and no more.
    assert claims.claim() == bucket
    # Then the bucket holds only what it refilled since: at most one job per 1/50 s
    # between the first claim's sending and the second's return.
    second = claims.claim()
    assert second <= min(bucket, math.floor(rate * (claims.returned[1] - claims.sent[0])))
    # A worker is told when the next whole job's worth is there (1/50 s at most).
    claims.claim()
    wait = claims.protocol.next_run_in(["default"], ["t"])
    assert wait is not None and wait <= 1 / rate

    first = len(claims.counts)
    while claims.returned[-1] - claims.returned[first - 1] < 1.0:
        claims.claim()
        time.sleep(0.01)
    claimed = sum(claims.counts[first:])
    # At most the part of a job the last claim before the loop left in the bucket, plus
    # 50 a second from that claim's sending to the loop's last return.
    elapsed = claims.returned[-1] - claims.sent[first - 1]
    assert claimed <= 1 + rate * elapsed
    # At least what each gap between claims surely refilled: the gap is no shorter than
    # from one claim's return to the next one's sending, and a full bucket counts as one
    # job less (the part of a job it held before may be lost to the cap). Less the part
    # of a job the last claim may leave in the bucket.
    refilled = sum(
        min(bucket - 1, rate * (claims.sent[i] - claims.returned[i - 1]))
        for i in range(first, len(claims.counts))
    )
    assert claimed >= math.floor(refilled) - 1


def test_a_slow_rate_still_starts_one_job_at_a_time(queue: Queue) -> None:
    claims = _TimedClaims(queue)
    _enqueue(queue, 3)
    queue.update_queue("default", rate_limit=2)  # a bucket of 1 job, one every 0.5 s
    time.sleep(0.55)
    assert claims.claim() == 1
    # Asked again at once, nothing: unless half a second went by in between.
    assert claims.claim() <= math.floor(2 * (claims.returned[1] - claims.sent[0]))
    wait = claims.protocol.next_run_in(["default"], ["t"])
    asked = time.monotonic()
    # The next job is due half a second after the first claim, less the time gone since.
    assert wait is not None
    assert 0.5 - (asked - claims.sent[0]) <= wait <= 0.5


def test_the_same_rate_given_again_keeps_its_bucket_and_a_new_one_empties_it(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 20)
    queue.update_queue("default", rate_limit=100)  # a bucket of 10 jobs
    # Three jobs' worth, and no refill before an hour from now.
    filled = psycopg.sql.SQL(
        "UPDATE {}.queue_settings SET tokens = 3, tokens_at = now() + interval '1 hour' "
        "WHERE queue = 'default'"
    ).format(psycopg.sql.Identifier(schema))
    db.execute(filled)
    # Set again, with another setting, as a client that sends all of them would.
    queue.update_queue("default", concurrency_limit=10, rate_limit=100)
    assert len(protocol.claim(["default"], ["t"], limit=10)) == 3

    db.execute(filled)
    # A new rate (one job per 500 s) starts from an empty bucket.
    queue.update_queue("default", rate_limit=0.002)
    assert protocol.claim(["default"], ["t"], limit=10) == []


def test_settings_left_out_are_kept_and_none_removes_a_limit(queue: Queue) -> None:
    _enqueue(queue, 1)
    queue.update_queue("default", concurrency_limit=4, rate_limit=2.5)
    info = queue.update_queue("default", paused=True)
    assert info == QueueInfo("default", True, 4, 2.5)
    assert queue.update_queue("default", rate_limit=None) == QueueInfo("default", True, 4, None)
    assert queue.update_queue("default") == QueueInfo("default", True, 4, None)
    stats = next(s for s in queue.stats() if s.queue == "default")
    assert (stats.paused, stats.concurrency_limit, stats.rate_limit) == (True, 4, None)
    assert UNSET is not None


def test_a_queue_that_never_existed_is_not_found_unless_created(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    with pytest.raises(QueueNotFound, match="'nowhere'"):
        queue.pause_queue("nowhere")
    with pytest.raises(QueueNotFound):
        queue.update_queue("nowhere", concurrency_limit=1)
    assert queue.pause_queue("later", create=True).paused
    # Configured before its first job, it is listed.
    assert [s.queue for s in queue.stats()] == ["later"]
    _enqueue(queue, 1, "later")
    assert protocol.claim(["later"], ["t"]) == []


def test_a_queue_with_only_finished_jobs_exists(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 1, "done")
    protocol.ack(protocol.claim(["done"], ["t"])[0])
    assert queue.update_queue("done", rate_limit=1).rate_limit == 1.0


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("concurrency_limit", -1, "must not be negative"),
        ("concurrency_limit", 1.5, "whole number"),
        ("concurrency_limit", True, "whole number"),
        ("concurrency_limit", 2**31, "at most"),
        ("rate_limit", 0, "greater than 0"),
        ("rate_limit", -2.0, "greater than 0"),
        ("rate_limit", math.nan, "finite"),
        ("rate_limit", math.inf, "finite"),
        ("rate_limit", "10", "number of jobs per second"),
        ("paused", "yes", "true or false"),
        ("paused", None, "true or false"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(
    queue: Queue, setting: str, value: object, message: str
) -> None:
    _enqueue(queue, 1)
    with pytest.raises(ValidationError, match=message) as refused:
        queue.update_queue("default", **{setting: value})
    assert refused.value.field == setting


def test_resuming_notifies_the_queue_at_once(queue: Queue, database_url: str) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 1)
    queue.pause_queue("default")
    # A worker waiting on a paused queue is not recorded as a waiter: enqueues into it
    # wake nobody, and the resume wakes every listener of the queue itself.
    protocol.claim(["default"], ["t"], waiter=Waiter("w/0", 30.0))
    with psycopg.connect(database_url, autocommit=True) as listener:
        protocol.listen(listener)
        _enqueue(queue, 1)
        assert [n.payload for n in listener.notifies(timeout=0.3, stop_after=1)] == []
        queue.resume_queue("default")
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ["default"]


def _limited_and_free(queue: Queue) -> dict[str, object]:
    """Two jobs in a limited queue and two in a free one; the parameters of a claim of
    both, for the claim statements run by hand."""
    _enqueue(queue, 2, "limited")
    _enqueue(queue, 2, "free")
    queue.update_queue("limited", concurrency_limit=5)
    return {
        "queues": ["limited", "free"],
        "tasks": ["t"],
        "limit": 10,
        "lease_seconds": 30,
        "worker_id": "w",
        "waiter": None,
        "waiter_seconds": None,
    }


def test_a_claim_that_did_not_lock_a_limited_queue_takes_nothing_from_it(
    queue: Queue, db, schema: str
) -> None:
    """A limit set between a claim's lock and its count (or a claim run without the
    lock) must not let that claim count room the next claim counts too."""
    params = _limited_and_free(queue)
    with db.transaction(force_rollback=True):
        rows = db.execute(queries.bind("job_claim_limited", schema), params).fetchall()
    assert len(rows) == 2  # the free queue's only
    with db.transaction(force_rollback=True):
        db.execute(queries.bind("job_claim_lock", schema), params)
        rows = db.execute(queries.bind("job_claim_limited", schema), params).fetchall()
    assert len(rows) == 4


def test_the_plain_claim_leaves_queues_with_settings_and_says_so(
    queue: Queue, db, schema: str
) -> None:
    """The claim of queues without settings takes nothing from one that has some, and
    job_claim_times tells the caller to use the limited claim for those queues."""
    params = _limited_and_free(queue)
    with db.transaction(force_rollback=True):
        rows = db.execute(queries.bind("job_claim", schema), params).fetchall()
        times = db.execute(queries.bind("job_claim_times", schema), params).fetchone()
    assert len(rows) == 2 and times[2] is True
    with db.transaction(force_rollback=True):
        db.execute(queries.bind("job_claim", schema), {**params, "queues": ["free"]})
        times = db.execute(
            queries.bind("job_claim_times", schema), {**params, "queues": ["free"]}
        ).fetchone()
    assert times[2] is False


def test_a_pause_holds_from_the_first_claim_after_it_whichever_claim_a_queue_used(
    queue: Queue,
) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 4, "steady")
    assert len(protocol.claim(["steady"], ["t"], limit=1)) == 1  # learns: no settings
    assert len(protocol.claim(["steady"], ["t"], limit=1)) == 1  # the plain claim
    queue.pause_queue("steady")
    assert protocol.claim(["steady"], ["t"], limit=10) == []  # plain: sees the row
    assert protocol.claim(["steady"], ["t"], limit=10) == []  # limited: paused
    queue.resume_queue("steady")
    assert len(protocol.claim(["steady"], ["t"], limit=10)) == 2


def test_a_limit_set_between_two_claims_costs_the_second_no_jobs(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    _enqueue(queue, 4, "steady")
    assert len(protocol.claim(["steady"], ["t"], limit=1)) == 1  # learns: no settings
    queue.update_queue("steady", concurrency_limit=5)
    # The plain claim takes nothing from a queue with settings; the same call claims
    # again with the limited statement instead of coming back short.
    assert len(protocol.claim(["steady"], ["t"], limit=2)) == 2
