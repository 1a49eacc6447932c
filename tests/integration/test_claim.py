"""Claiming: one statement, claim order, task filters, and no job claimed twice."""

import threading
import time
from collections import Counter

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobSpec, JobState, Queue, WorkerProtocol


def test_claim_takes_many_jobs_in_priority_then_run_at_order(queue):
    protocol = WorkerProtocol(queue)
    low = queue.enqueue("t", priority=-1).job
    first = queue.enqueue("t", priority=0).job
    second = queue.enqueue("t", priority=0).job
    urgent = queue.enqueue("t", priority=10).job
    claimed = protocol.claim(["default"], ["t"], limit=10, worker_id="w")
    assert [j.id for j in claimed] == [urgent.id, first.id, second.id, low.id]
    assert all(j.state is JobState.RUNNING and j.attempts == 1 for j in claimed)
    assert len({j.lease_token for j in claimed}) == 4
    assert all(j.worker_id == "w" and j.lease_expires_at > j.started_at for j in claimed)


def test_a_claimed_job_is_its_row_as_the_claim_left_it(queue):
    # The claim returns per row only what differs between rows; the rest (state,
    # worker, start and lease expiry) comes once per claim and must match every row.
    protocol = WorkerProtocol(queue)
    queue.enqueue("t", {"n": 1}, idempotency_key="k1", timeout_seconds=2.5)
    queue.enqueue("t", {"n": 2}, priority=3, max_attempts=7)
    claimed = protocol.claim(["default"], ["t"], limit=5, lease_seconds=12.5, worker_id="w-9")
    assert len(claimed) == 2
    for job in claimed:
        assert job == queue.get(job.id)
    assert (claimed[0].lease_expires_at - claimed[0].started_at).total_seconds() == 12.5


def test_claim_respects_limit_queues_tasks_and_run_at(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue("mine", queue="a")
    queue.enqueue("mine", queue="b")
    queue.enqueue("theirs", queue="a")
    queue.enqueue("mine", queue="a", delay_seconds=3600)
    queue.enqueue("mine", queue="a")
    claimed = protocol.claim(["a"], ["mine"], limit=1)
    assert len(claimed) == 1
    rest = protocol.claim(["a"], ["mine"], limit=10)
    assert len(rest) == 1
    assert {(j.queue, j.task) for j in claimed + rest} == {("a", "mine")}
    assert protocol.claim(["a"], [], limit=10) == []


def test_a_claim_of_several_queues_and_tasks_takes_their_best_jobs_in_claim_order(queue):
    protocol = WorkerProtocol(queue)
    for _ in range(3):
        queue.enqueue("typo", priority=9)  # a task the claim does not ask for
    a_low = queue.enqueue("a", priority=0).job
    b_high = queue.enqueue("b", priority=5).job
    a_high = queue.enqueue("a", priority=5).job
    queue.enqueue("b", priority=0)
    a_mid = queue.enqueue("a", priority=2).job
    elsewhere = queue.enqueue("a", queue="q2", priority=7).job
    claimed = protocol.claim(["default", "q2"], ["a", "b"], limit=4)
    assert [j.id for j in claimed] == [elsewhere.id, b_high.id, a_high.id, a_mid.id]
    rest = protocol.claim(["default", "q2"], ["a", "b"], limit=4)
    assert [j.priority for j in rest] == [0, 0] and a_low.id in {j.id for j in rest}
    assert {j.task for j in claimed + rest} == {"a", "b"}


@pytest.mark.parametrize("settings", [False, True], ids=["plain", "with-settings"])
def test_a_claim_comes_back_full_while_another_claim_holds_the_best_jobs(
    queue, database_url, settings
):
    """The best jobs of the claim's tasks are all task a's, and another claim holds
    them: the claim takes b's jobs instead of coming back short."""
    protocol = WorkerProtocol(queue)
    if settings:
        # A queue with settings (none limiting) is claimed by job_claim_limited.
        queue.update_queue("default", create=True)
    queue.enqueue_many(JobSpec("a", priority=5) for _ in range(3))
    bs = [result.job.id for result in queue.enqueue_many(JobSpec("b") for _ in range(5))]
    with psycopg.connect(database_url) as other:
        held = other.execute(
            sql.SQL("SELECT id FROM {} WHERE task = 'a' FOR UPDATE").format(
                sql.Identifier(queue.schema, "active_jobs")
            )
        ).fetchall()
        assert len(held) == 3
        claimed = protocol.claim(["default"], ["a", "b"], limit=4)
        other.rollback()
    assert [j.id for j in claimed] == bs[:4]


@pytest.mark.parametrize("mode", ["skip-locked", "for-update"])
def test_concurrent_claimers_never_share_a_job_and_together_take_all(queue, mode):
    total = 2000 if mode == "skip-locked" else 300
    queue.enqueue_many(JobSpec("t", {"i": i}) for i in range(total))
    claimed: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def claimer(n: int) -> None:
        protocol = WorkerProtocol(queue)
        barrier.wait()
        while True:
            jobs = protocol.claim(["default"], ["t"], limit=1 + n % 7, worker_id=f"w{n}", mode=mode)
            if not jobs:
                return
            with lock:
                claimed.extend(j.id for j in jobs)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duplicates = [job_id for job_id, n in Counter(claimed).items() if n > 1]
    assert duplicates == []
    assert len(claimed) == total


def test_next_run_in_is_the_wait_for_the_earliest_queued_job_of_these_tasks(queue):
    protocol = WorkerProtocol(queue)
    assert protocol.next_run_in(["default"], ["t"]) is None
    queue.enqueue("t", delay_seconds=50)
    queue.enqueue("other", delay_seconds=5)
    assert 40 < protocol.next_run_in(["default"], ["t"]) <= 50
    # Whatever their priority: a lower one due sooner, a higher one due later.
    queue.enqueue("t", delay_seconds=30, priority=-3)
    queue.enqueue("t", delay_seconds=80, priority=4)
    queue.enqueue("u", delay_seconds=20, priority=1)
    assert 20 < protocol.next_run_in(["default"], ["t"]) <= 30
    assert 10 < protocol.next_run_in(["default"], ["t", "u"]) <= 20
    queue.enqueue("t")
    assert protocol.next_run_in(["default"], ["t"]) <= 0


def test_heartbeat_extends_held_leases_and_reports_lost_ones(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue_many([JobSpec("t"), JobSpec("t")])
    kept, cancelled = protocol.claim(["default"], ["t"], limit=2, lease_seconds=5)
    queue.cancel(cancelled.id)
    time.sleep(0.05)
    from pgqueue import Lease

    lost = protocol.heartbeat(
        [Lease(kept.id, kept.lease_token), Lease(cancelled.id, cancelled.lease_token)],
        lease_seconds=60,
    )
    assert lost == {cancelled.id}
    assert queue.get(kept.id).lease_expires_at > kept.lease_expires_at


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
def test_claims_reuse_one_generic_plan_and_leave_the_connections_settings_alone(
    database_url, schema, limited
):
    # A custom plan would plan the claim anew at every call (a generic plan prices its
    # LIMIT as a tenth of the table, so PostgreSQL would never pick it by itself).
    with Queue.connect(database_url, schema=schema, max_size=1) as queue:
        protocol = WorkerProtocol(queue)
        if limited:
            queue.update_queue("default", concurrency_limit=1000, create=True)
        queue.enqueue_many([JobSpec("t", {"n": n}) for n in range(40)])
        with queue.pool.connection() as conn:
            conn.execute("SET plan_cache_mode = force_custom_plan")
            conn.execute("SET jit = on")
            conn.commit()
        claimed = []
        for _ in range(20):
            claimed += protocol.claim(["default"], ["t"], limit=2, worker_id="w")
        assert len(claimed) == 40
        with queue.pool.connection() as conn:
            statement = "job_claim_limited" if limited else "job_claim"
            marker = "room AS MATERIALIZED" if limited else "WITH sources AS MATERIALIZED"
            plans = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE %s",
                [f"%{marker}%"],
            ).fetchall()
            assert plans, f"{statement} was not prepared"
            ((generic, custom),) = plans
            # psycopg prepares a statement after its fifth execution: every execution of
            # the prepared statement ran its one generic plan, none a custom one.
            assert custom == 0
            assert generic >= 10
            # Set for the claim's transaction only: the session keeps its own settings.
            settings = conn.execute(
                "SELECT current_setting('plan_cache_mode'), current_setting('jit')"
            )
            assert settings.fetchone() == ("force_custom_plan", "on")
