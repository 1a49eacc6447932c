"""The real queue against a model of its state machine, in random interleavings.

Hypothesis drives pgqueue's core on real PostgreSQL through sequences of enqueues
(priorities, delays, idempotency and unique keys, dependencies on jobs in any state,
unknown dependencies, batches whose items depend on earlier items), claims by two
logical workers, heartbeats, acks and failures (with current and stale leases), lease
expiry, reaping, cancels, retries, pruning, pausing and resuming queues and limiting
their concurrency. After every step every job in the database is compared with the
model (queue_model.py): its state, its attempt count, the lease that may finish it,
the reason of a cancellation by a dependency, that it is in exactly one of the two job
tables, and that nothing disappeared before it was pruned; the dependency edges and
the queue's counts must equal the model's. Claims must take exactly what the model
says, so a waiting job is never claimed, nor a job of a paused queue.

The only SQL the test writes itself moves a lease's expiry into the past, which stands
for time passing. Retries back off for at most a millisecond, which each claim lets
pass first, so that the model knows exactly which jobs a claim must take.

``nox -s tests`` runs a fixed budget of examples; ``nox -s model`` runs for minutes and
writes its statistics to results/model.json (``PGQUEUE_MODEL_SECONDS``).
"""

from __future__ import annotations

import os
import time
import uuid

import psycopg_pool
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from model_results import ModelStatistics, write_model_results
from psycopg import sql
from queue_model import FINISHED, QUEUES, STATES, TASK, Holding, ModelJob, QueueModel

from pgqueue import (
    BatchItem,
    IdempotencyConflict,
    InvalidTransition,
    Job,
    JobSpec,
    Lease,
    LeaseLost,
    Queue,
    QueueNotFound,
    UniqueKeyHeld,
    UnknownDependencies,
    WorkerProtocol,
    migrations,
)

WORKERS = ("w0", "w1")
KEYS = ("k0", "k1", "k2")
UNIQUE_KEYS = ("u0", "u1")
# An id no job ever has in an example.
NEVER_A_JOB = 2**40
# Backoffs of at most this long: a claim sleeps longer first, so every retried job is
# runnable when the model says it is.
BACKOFF_SECONDS = 0.001

STATISTICS = ModelStatistics()


class QueueMachine(RuleBasedStateMachine):
    """One example: a fresh schema, a queue on it, and the model beside it."""

    pool: psycopg_pool.ConnectionPool
    database_url: str

    def __init__(self) -> None:
        super().__init__()
        self.schema = f"model_{uuid.uuid4().hex[:10]}"
        migrations.migrate(self.database_url, self.schema)
        self.queue = Queue(
            self.pool, schema=self.schema, retry_base=BACKOFF_SECONDS, retry_cap=BACKOFF_SECONDS
        )
        self.model = QueueModel()
        self.configured: set[str] = set()
        """Queues given settings: they exist whether or not they ever had a job."""
        STATISTICS.examples += 1

    def teardown(self) -> None:
        with self.pool.connection() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))

    def _step(self) -> None:
        STATISTICS.steps += 1

    # -- producing ------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.model.holdings = {worker: [] for worker in WORKERS}

    @rule(
        queue=st.sampled_from(QUEUES),
        priority=st.integers(-2, 2),
        delayed=st.booleans(),
        max_attempts=st.integers(1, 3),
        key=st.none() | st.sampled_from(KEYS),
        unique_key=st.none() | st.sampled_from(UNIQUE_KEYS),
    )
    def enqueue(
        self,
        queue: str,
        priority: int,
        delayed: bool,
        max_attempts: int,
        key: str | None,
        unique_key: str | None,
    ) -> None:
        """The idempotency key is looked at first (its job, whatever its state, and a
        conflict if the job differs); then the unique key (its queued or running job)."""
        self._step()
        holder = None if key is None else self.model.by_key(key)
        options = {
            "queue": queue,
            "priority": priority,
            "delay_seconds": 3600 if delayed else None,
            "max_attempts": max_attempts,
            "idempotency_key": key,
            "unique_key": unique_key,
        }
        if holder is not None and holder.queue != queue:
            with pytest.raises(IdempotencyConflict):
                self.queue.enqueue(TASK, {}, **options)
            return
        if holder is None and unique_key is not None:
            holder = self.model.unique_holder(unique_key)
        outcome = self.queue.enqueue(TASK, {}, **options)
        if holder is not None:
            assert not outcome.created and outcome.job.id == holder.id
            return
        assert outcome.created and outcome.job.id not in self.model.jobs
        self._add(outcome.job, delayed, key)

    @rule(
        queue=st.sampled_from(QUEUES),
        priority=st.integers(-2, 2),
        delayed=st.booleans(),
        picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3),
        unknown=st.sampled_from([None, None, None, "never", "pruned"]),
        key=st.none() | st.sampled_from(KEYS),
        unique_key=st.none() | st.sampled_from(UNIQUE_KEYS),
    )
    def enqueue_with_dependencies(
        self,
        queue: str,
        priority: int,
        delayed: bool,
        picks: list[int],
        unknown: str | None,
        key: str | None,
        unique_key: str | None,
    ) -> None:
        """Dependencies on jobs in any state; an unknown id refuses the whole enqueue
        before any key is looked at."""
        self._step()
        depends_on = self._dependencies(picks, unknown)
        if not depends_on:
            return
        options = {
            "queue": queue,
            "priority": priority,
            "delay_seconds": 3600 if delayed else None,
            "idempotency_key": key,
            "unique_key": unique_key,
            "depends_on": depends_on,
        }
        missing = sorted(set(depends_on) - set(self.model.jobs))
        if missing:
            with pytest.raises(UnknownDependencies) as refused:
                self.queue.enqueue(TASK, {}, **options)
            assert refused.value.job_ids == missing and refused.value.index is None
            return
        holder = None if key is None else self.model.by_key(key)
        if holder is not None and holder.queue != queue:
            with pytest.raises(IdempotencyConflict):
                self.queue.enqueue(TASK, {}, **options)
            return
        if holder is None and unique_key is not None:
            holder = self.model.unique_holder(unique_key)
        state = self.model.expected_state(set(depends_on))
        outcome = self.queue.enqueue(TASK, {}, **options)
        if holder is not None:
            assert not outcome.created and outcome.job.id == holder.id
            return
        assert outcome.created and outcome.job.id not in self.model.jobs
        assert outcome.job.state.value == state
        self._add(outcome.job, delayed, key, set(depends_on))

    @rule(
        queue=st.sampled_from(QUEUES),
        items=st.lists(
            st.tuples(st.lists(st.integers(0, 1000), max_size=3), st.booleans()),
            min_size=2,
            max_size=4,
        ),
        unknown=st.sampled_from([None, None, None, "never", "pruned"]),
        unknown_at=st.integers(0, 3),
    )
    def enqueue_batch_with_dependencies(
        self,
        queue: str,
        items: list[tuple[list[int], bool]],
        unknown: str | None,
        unknown_at: int,
    ) -> None:
        """Each pick names an earlier item of the batch (BatchItem) or, with ``by_id``,
        a job enqueued before; a batch naming an unknown id adds nothing."""
        self._step()
        specs: list[JobSpec] = []
        for index, (picks, by_id) in enumerate(items):
            depends_on: list[int | BatchItem] = []
            if by_id or index == 0:
                depends_on += self._dependencies(picks, None)
            else:
                depends_on += [BatchItem(pick % index) for pick in picks]
            if unknown is not None and index == unknown_at % len(items):
                depends_on += self._dependencies([], unknown)
            specs.append(JobSpec(TASK, {"n": index}, queue=queue, depends_on=depends_on))
        known = set(self.model.jobs)
        missing = [
            (index, sorted({d for d in spec.depends_on if isinstance(d, int)} - known))
            for index, spec in enumerate(specs)
        ]
        missing = [(index, ids) for index, ids in missing if ids]
        if missing:
            index, ids = missing[0]
            with pytest.raises(UnknownDependencies) as refused:
                self.queue.enqueue_many(specs)
            assert (refused.value.index, refused.value.job_ids) == (index, ids)
            return
        results = self.queue.enqueue_many(specs)
        assert len(results) == len(specs) and all(result.created for result in results)
        for spec, result in zip(specs, results, strict=True):
            resolved = {
                results[d.index].job.id if isinstance(d, BatchItem) else d for d in spec.depends_on
            }
            assert result.job.state.value == self.model.expected_state(resolved)
            self._add(result.job, False, None, resolved)

    def _dependencies(self, picks: list[int], unknown: str | None) -> list[int]:
        """Ids of known jobs (any state) picked by ``picks``, and one unknown id: one
        never used, or one of a pruned job (if any, else none)."""
        ids = sorted(self.model.jobs)
        chosen = [ids[pick % len(ids)] for pick in picks] if ids else []
        if unknown == "never":
            chosen.append(NEVER_A_JOB)
        elif unknown == "pruned" and self.model.pruned_ids:
            pruned = sorted(self.model.pruned_ids)
            chosen.append(pruned[len(chosen) % len(pruned)])
        return chosen

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 4), priority=st.integers(-2, 2))
    def enqueue_many(self, queue: str, count: int, priority: int) -> None:
        self._step()
        specs = [JobSpec(TASK, {"n": n}, queue=queue, priority=priority) for n in range(count)]
        results = self.queue.enqueue_many(specs)
        assert all(result.created for result in results)
        for result in results:
            self._add(result.job, delayed=False, key=None)

    def _add(
        self, job: Job, delayed: bool, key: str | None, depends_on: set[int] | None = None
    ) -> None:
        assert job.attempts == 0
        created = ModelJob(
            id=job.id,
            queue=job.queue,
            priority=job.priority,
            max_attempts=job.max_attempts,
            run_at=job.run_at,
            delayed=delayed,
            key=key,
            unique_key=job.unique_key,
        )
        self.model.enqueued(created, depends_on or set())

    # -- working ----------------------------------------------------------------------

    @rule(worker=st.sampled_from(WORKERS), queue=st.sampled_from(QUEUES), limit=st.integers(1, 3))
    def claim(self, worker: str, queue: str, limit: int) -> None:
        protocol = WorkerProtocol(self.queue)
        self._step()
        time.sleep(2 * BACKOFF_SECONDS)
        expected = [job.id for job in self.model.claimable(queue, limit)]
        claimed = protocol.claim([queue], [TASK], limit, worker_id=worker)
        assert [job.id for job in claimed] == expected
        for job in claimed:
            assert job.worker_id == worker and job.lease_token is not None
            self.model.claimed(worker, job)
            assert job.attempts == self.model.jobs[job.id].attempts

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        protocol = WorkerProtocol(self.queue)
        self._step()
        held = self.model.holdings[worker]
        leases = [_lease(holding) for holding in held]
        lost = protocol.heartbeat(leases)
        # Ids, not leases, come back: a worker that holds a stale lease of a job beside
        # the current one (it claimed the job again after its first lease was reaped)
        # hears that id is fine. The stale attempt cannot finish: its ack is refused.
        current = {h.job_id for h in held if self.model.current(h)}
        assert lost == {h.job_id for h in held if not self.model.current(h)} - current
        for holding in held:
            if self.model.current(holding):
                self.model.jobs[holding.job_id].expired = False

    @precondition(lambda self: any(self.model.holdings.values()))
    @rule(pick=st.integers(0, 1000), succeed=st.booleans())
    def finish(self, pick: int, succeed: bool) -> None:
        """A worker acks or fails one attempt it holds, current or stale."""
        protocol = WorkerProtocol(self.queue)
        self._step()
        held = [(w, h) for w, hs in self.model.holdings.items() for h in hs]
        worker, holding = held[pick % len(held)]
        self.model.holdings[worker].remove(holding)
        claimed = holding.claimed
        if not self.model.current(holding):
            with pytest.raises(LeaseLost):
                protocol.ack(claimed) if succeed else protocol.fail(claimed, "boom")
            return
        if succeed:
            done = protocol.ack(claimed, {"ok": True})
            assert done.state.value == "succeeded"
            self.model.finished(claimed.id, "succeeded")
        else:
            done = protocol.fail(claimed, "boom")
            self.model.failed(claimed.id, done.run_at)
            assert done.state.value == self.model.jobs[claimed.id].state

    @precondition(lambda self: any(j.state == "running" for j in self.model.jobs.values()))
    @rule(pick=st.integers(0, 1000))
    def expire_a_lease(self, pick: int) -> None:
        self._step()
        running = sorted(j.id for j in self.model.jobs.values() if j.state == "running")
        job_id = running[pick % len(running)]
        with self.pool.connection() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET lease_expires_at = now() - interval '1 second' WHERE id = %s"
                ).format(sql.Identifier(self.schema, "active_jobs")),
                (job_id,),
            )
        self.model.jobs[job_id].expired = True

    @rule()
    def reap(self) -> None:
        protocol = WorkerProtocol(self.queue)
        self._step()
        expected = {j.id for j in self.model.jobs.values() if j.state == "running" and j.expired}
        reaped = protocol.reap()
        assert reaped is not None and {job.id for job in reaped} == expected
        for job in reaped:
            self.model.failed(job.id, job.run_at)
            assert job.state.value == self.model.jobs[job.id].state
            assert job.attempts == self.model.jobs[job.id].attempts

    # -- operating ----------------------------------------------------------------------

    @precondition(lambda self: self.model.jobs)
    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick: int) -> None:
        self._step()
        job = self._pick(pick)
        if job.state in FINISHED:
            with pytest.raises(InvalidTransition):
                self.queue.cancel(job.id)
            return
        assert self.queue.cancel(job.id).state.value == "cancelled"
        # Its waiting dependents are cancelled too, and theirs in turn.
        self.model.finished(job.id, "cancelled")

    @precondition(lambda self: self.model.jobs)
    @rule(pick=st.integers(0, 1000))
    def retry(self, pick: int) -> None:
        self._step()
        job = self._pick(pick)
        if job.state not in ("dead", "cancelled"):
            with pytest.raises(InvalidTransition):
                self.queue.retry(job.id)
            return
        holder = None if job.unique_key is None else self.model.unique_holder(job.unique_key)
        if holder is not None:
            with pytest.raises(UniqueKeyHeld, match=f"job {holder.id}"):
                self.queue.retry(job.id)
            return
        retried = self.queue.retry(job.id)
        assert (retried.state.value, retried.attempts) == ("queued", 0)
        self.model.retried(job.id, retried.run_at)

    @rule(queue=st.sampled_from(QUEUES), paused=st.booleans(), create=st.booleans())
    def pause_or_resume(self, queue: str, paused: bool, create: bool) -> None:
        """Without ``create``, only a queue that exists: one with settings, jobs in any
        state (waiting ones too), or finished jobs counted, even if pruned since."""
        self._step()
        known = (
            queue in self.configured
            or any(job.queue == queue for job in self.model.jobs.values())
            or queue in self.model.pruned_queues
        )
        if not (create or known):
            with pytest.raises(QueueNotFound):
                self.queue.update_queue(queue, paused=paused)
            return
        self.configured.add(queue)
        if paused:
            info = self.queue.pause_queue(queue, create=create)
            self.model.paused.add(queue)
        else:
            info = self.queue.update_queue(queue, paused=False, create=create)
            self.model.paused.discard(queue)
        assert info.paused is paused

    @rule(queue=st.sampled_from(QUEUES), limit=st.none() | st.integers(0, 2))
    def limit_concurrency(self, queue: str, limit: int | None) -> None:
        self._step()
        self.configured.add(queue)
        info = self.queue.update_queue(queue, concurrency_limit=limit, create=True)
        assert info.concurrency_limit == limit
        if limit is None:
            self.model.concurrency_limits.pop(queue, None)
        else:
            self.model.concurrency_limits[queue] = limit

    @rule()
    def prune(self) -> None:
        self._step()
        pruned = self.queue.prune(0)
        assert pruned == sum(1 for j in self.model.jobs.values() if j.state in FINISHED)
        self.model.pruned()

    @precondition(lambda self: self.model.jobs or self.model.pruned_ids)
    @rule(pick=st.integers(0, 1000))
    def inspect_dependencies(self, pick: int) -> None:
        """Both directions, for a job or a pruned one (whose dependents keep its id)."""
        self._step()
        ids = sorted(set(self.model.jobs) | self.model.pruned_ids)
        job_id = ids[pick % len(ids)]
        found = self.queue.dependencies(job_id)
        assert (found.depends_on, found.dependents) == self.model.dependencies(job_id)

    def _pick(self, pick: int) -> ModelJob:
        ids = sorted(self.model.jobs)
        return self.model.jobs[ids[pick % len(ids)]]

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def every_job_is_what_the_model_says(self) -> None:
        STATISTICS.invariant_checks += 1
        with self.pool.connection() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT id, state::text, attempts, lease_token, last_error, 'active' "
                    "FROM {active} UNION ALL SELECT id, state::text, attempts, lease_token, "
                    "last_error, 'finished' FROM {finished}"
                ).format(
                    active=sql.Identifier(self.schema, "active_jobs"),
                    finished=sql.Identifier(self.schema, "finished_jobs"),
                )
            ).fetchall()
        ids = [row[0] for row in rows]
        assert len(ids) == len(set(ids)), "a job is in both tables"
        assert set(ids) == set(self.model.jobs), "a job appeared or disappeared"
        for job_id, state, attempts, token, last_error, table in rows:
            expected = self.model.jobs[job_id]
            assert (state, attempts) == (expected.state, expected.attempts), job_id
            assert table == ("finished" if state in FINISHED else "active")
            if state == "running":
                assert token == expected.token
            if state == "cancelled" and expected.reason is not None:
                assert last_error == expected.reason, job_id

    @invariant()
    def the_dependencies_are_the_models(self) -> None:
        STATISTICS.invariant_checks += 1
        with self.pool.connection() as conn:
            edges = conn.execute(
                sql.SQL("SELECT depends_on, job_id FROM {}").format(
                    sql.Identifier(self.schema, "job_dependencies")
                )
            ).fetchall()
        assert set(edges) == self.model.edges

    @invariant()
    def the_counts_are_the_models(self) -> None:
        STATISTICS.invariant_checks += 1
        reported = {stats.queue: stats.counts for stats in self.queue.stats()}
        for queue in QUEUES:
            counts = reported.get(queue, dict.fromkeys(STATES, 0))
            assert {s: counts.get(s, 0) for s in STATES} == self.model.counts(queue), queue


def _lease(holding: Holding) -> Lease:
    return Lease(holding.job_id, holding.token)


@pytest.fixture
def machine(database_url: str):
    # A statement that waits this long is a defect to report, not a reason to hang.
    bounded = {"options": "-c statement_timeout=60s -c lock_timeout=30s"}
    with psycopg_pool.ConnectionPool(
        database_url, min_size=1, max_size=2, kwargs=bounded, open=True
    ) as pool:
        QueueMachine.pool = pool
        QueueMachine.database_url = database_url
        yield QueueMachine


# Shrinking a failure replays examples on the database: give it time to finish.
@pytest.mark.timeout(900)
def test_the_queue_behaves_as_its_model(machine) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("PGQUEUE_MODEL_EXAMPLES", "25")),
            stateful_step_count=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


LONG_RUN_SECONDS = float(os.environ.get("PGQUEUE_MODEL_SECONDS", "0"))


@pytest.mark.skipif(not LONG_RUN_SECONDS, reason="the long run: nox -s model")
# Past the time asked for by one batch of examples at most; stops at the first failure.
@pytest.mark.timeout(LONG_RUN_SECONDS + 900)
def test_the_queue_behaves_as_its_model_for_minutes(machine, server_version: int) -> None:
    deadline = time.monotonic() + LONG_RUN_SECONDS
    started = time.monotonic()
    runs = 0
    while time.monotonic() < deadline:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=20,
                stateful_step_count=60,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
        runs += 1
    write_model_results(STATISTICS, server_version, time.monotonic() - started, runs)
