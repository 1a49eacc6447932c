"""The worker's rules: claims, heartbeats, acks and failures, lease expiry and the
reaper, and rows written around pgqueue that Python cannot decode."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from machine import BACKOFF_SECONDS, LEASE_SECONDS, WORKERS, job_ids
from psycopg import sql
from queue_model import QUEUES, TASK, Holding, ModelJob, QueueModel

from pgqueue import DatabaseUnavailable, Job, Lease, LeaseLost, WorkerProtocol

POISONS = {
    # PostgreSQL prints the number in full: 5,001 digits, past what Python's int() reads.
    "huge number": '{"n": 1e5000}',
    # Deeper than Python's decoder goes, even with the recursion limit Hypothesis raises.
    "deep nesting": '{"n": ' + "[" * 5000 + "]" * 5000 + "}",
}


class WorkingRules:
    """Two logical workers claim, beat, ack and fail; the test expires leases (time
    passing) and reaps them."""

    @rule(worker=st.sampled_from(WORKERS), queue=st.sampled_from(QUEUES), limit=st.integers(1, 3))
    def claim(self, worker: str, queue: str, limit: int) -> None:
        self._step()
        self._claim(self._protocol(), worker, queue, limit, [self.model])

    @rule()
    def work(self) -> None:
        """What a busy worker's loop does: it acks everything it holds with its next
        claim, of up to three jobs from both queues, in one transaction (the claim sees
        what the acks released). The rule Hypothesis draws most often (it takes no
        arguments), so that jobs flow through to the end."""
        self._step()
        worker = WORKERS[1]
        held = list(self.model.holdings[worker])
        current = [h for h in held if self.model.current(h)]
        stale = [h for h in held if not self.model.current(h)]
        self.model.holdings[worker] = []
        for holding in current:
            self.model.finished(holding.job_id, "succeeded")
        expected = self._expected_claim(QUEUES, 3, [self.model])
        acked = self._protocol().ack_and_claim(
            [(holding.claimed, {"ok": True}) for holding in held],
            QUEUES,
            [TASK],
            3,
            lease_seconds=LEASE_SECONDS,
            worker_id=worker,
        )
        batch = acked.settle()
        assert sorted(job_ids(batch.succeeded)) == sorted(h.job_id for h in current)
        assert sorted(batch.lost) == sorted(h.job_id for h in stale)
        self._check_claimed(worker, expected, acked.jobs, [self.model])

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        self._step()
        self._heartbeat(self._protocol(), worker, [self.model])

    @precondition(lambda self: any(self.model.holdings.values()))
    @rule(pick=st.integers(0, 1000), succeed=st.booleans())
    def finish(self, pick: int, succeed: bool) -> None:
        """A worker acks or fails one attempt it holds, current or stale."""
        self._step()
        held = [(w, h) for w, hs in self.model.holdings.items() for h in hs]
        worker, holding = held[pick % len(held)]
        self._finish(self._protocol(), worker, holding, succeed, [self.model])

    @precondition(lambda self: any(j.state == "running" for j in self.model.jobs.values()))
    @rule(pick=st.integers(0, 1000))
    def expire_a_lease(self, pick: int) -> None:
        self._step()
        running = sorted(j.id for j in self.model.jobs.values() if j.state == "running")
        job_id = running[pick % len(running)]
        self.execute(
            sql.SQL(
                "UPDATE {} SET lease_expires_at = now() - interval '1 second' WHERE id = %s"
            ).format(self.table("active_jobs")),
            (job_id,),
        )
        self.model.lease_expired(job_id)

    # An expired row whose payload Python cannot read is reaped like any other (a reaper
    # that raised on it would never reap anything again).
    @rule(limit=st.sampled_from([1, 2, 1000]))
    def reap(self, limit: int) -> None:
        """A reaper round of up to ``limit`` expired leases, oldest expiry first."""
        self._step()
        expected = set(self.model.reapable(limit))
        reaped = self._protocol().reap(limit)
        assert reaped is not None and {job.id for job in reaped} == expected
        self.model.failed([(job.id, job.run_at) for job in reaped])
        for job in reaped:
            assert job.state.value == self.model.jobs[job.id].state
            assert job.attempts == self.model.jobs[job.id].attempts

    # A claim that takes a row whose payload Python cannot read fails that attempt alone;
    # the rest of its batch reaches the worker (it used to raise after committing).
    @rule(
        kind=st.sampled_from(sorted(POISONS)),
        queue=st.sampled_from(QUEUES),
        priority=st.integers(-2, 2),
        max_attempts=st.integers(1, 2),
        running=st.booleans(),
    )
    def insert_poison_row(
        self, kind: str, queue: str, priority: int, max_attempts: int, running: bool
    ) -> None:
        """A job inserted by raw SQL (another client, another language, by hand) whose
        payload PostgreSQL stores and Python cannot decode: queued, or ``running`` under
        a lease that has expired (its worker gone). Claimed, it must fail alone, with a
        clear error; reaped, read, cancelled or retried, it must not break anything."""
        self._step()
        if running:
            statement = (
                "INSERT INTO {} (queue, task, payload, priority, max_attempts, state, "
                "attempts, lease_token, lease_expires_at, worker_id, started_at) "
                "VALUES (%s, %s, %s::jsonb, %s, %s, 'running', 1, gen_random_uuid(), "
                "now() - interval '1 second', 'elsewhere', now()) "
                "RETURNING id, run_at, lease_token"
            )
        else:
            statement = (
                "INSERT INTO {} (queue, task, payload, priority, max_attempts) "
                "VALUES (%s, %s, %s::jsonb, %s, %s) RETURNING id, run_at, lease_token"
            )
        [(job_id, run_at, token)] = self.execute(
            sql.SQL(statement).format(self.table("active_jobs")),
            (queue, TASK, POISONS[kind], priority, max_attempts),
        )
        self.model.jobs[job_id] = ModelJob(
            id=job_id,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            run_at=run_at,
            delayed=False,
            key=None,
            state="running" if running else "queued",
            attempts=1 if running else 0,
            token=token,
            poison=kind,
        )
        if running:
            self.model.lease_expired(job_id)

    # -- shared with the calls made inside a producer's transaction ------------------

    def _expected_claim(
        self, queues: Sequence[str], limit: int, models: list[QueueModel]
    ) -> list[int]:
        """The ids a claim of ``queues`` must take now, in claim order, as models[0]
        (what the claim sees) says: up to ``limit`` from each queue, the best ``limit``
        of them. The run_at of every job comes from the database first: the server
        decides it."""
        time.sleep(2 * BACKOFF_SECONDS)
        rows = self.execute(
            sql.SQL("SELECT id, run_at FROM {}").format(self.table("active_jobs")),
        )
        for job_id, run_at in rows:
            for model in models:
                if job_id in model.jobs:
                    model.jobs[job_id].run_at = run_at
        candidates = [job for queue in queues for job in models[0].claimable(queue, limit)]
        candidates.sort(key=lambda j: (-j.priority, j.run_at, j.id))
        return [job.id for job in candidates[:limit]]

    def _claim(
        self,
        protocol: WorkerProtocol,
        worker: str,
        queue: str,
        limit: int,
        models: list[QueueModel],
    ) -> None:
        expected = self._expected_claim([queue], limit, models)
        claimed = protocol.claim(
            [queue], [TASK], limit, worker_id=worker, lease_seconds=LEASE_SECONDS
        )
        self._check_claimed(worker, expected, claimed, models)

    def _check_claimed(
        self, worker: str, expected: list[int], claimed: list[Job], models: list[QueueModel]
    ) -> None:
        """The claim took exactly ``expected``: the jobs it returned, in claim order, and
        those whose payload cannot be decoded, each failed at once with a clear error,
        without holding back the others."""
        poisoned = [i for i in expected if models[0].jobs[i].poison is not None]
        runnable = [i for i in expected if i not in poisoned]
        assert job_ids(claimed) == runnable, (
            f"the claim took {job_ids(claimed)}; the model says {runnable}"
            + (f" (and {poisoned}, failed at once)" if poisoned else "")
        )
        for job in claimed:
            assert job.worker_id == worker and job.lease_token is not None
            for model in models:
                model.claimed(worker, job)
            assert job.attempts == models[0].jobs[job.id].attempts
        self._check_dependencies_succeeded(job_ids(claimed), models[0])
        if not poisoned:
            return
        rows = self.execute(
            sql.SQL(
                "SELECT id, state::text, attempts, run_at, last_error FROM {} WHERE id = ANY(%s)"
            ).format(self.table("jobs")),
            (poisoned,),
        )
        for model in models:
            model.refused([(job_id, run_at) for job_id, _, _, run_at, _ in rows])
        for job_id, state, attempts, _, last_error in rows:
            expected_job = models[0].jobs[job_id]
            assert (state, attempts) == (expected_job.state, expected_job.attempts), (
                f"job {job_id}, whose payload cannot be decoded, is {state} after {attempts} "
                f"attempts; the model says {expected_job.state} after {expected_job.attempts}"
            )
            assert last_error is not None and "payload" in last_error and "decod" in last_error, (
                f"job {job_id}'s payload could not be decoded; its error says {last_error!r}"
            )

    def _check_dependencies_succeeded(self, ids: list[int], model: QueueModel) -> None:
        """Nothing is claimed whose dependencies have not all succeeded (in the default
        mode; see rules_dependency_modes.py for "finished")."""
        rows = self.execute(
            sql.SQL(
                "SELECT dependency.job_id, dependency.depends_on, job.state::text FROM {} "
                "AS dependency LEFT JOIN {} AS job ON job.id = dependency.depends_on "
                "WHERE dependency.job_id = ANY(%s) AND NOT dependency.finished_mode"
            ).format(self.table("job_dependencies"), self.table("jobs")),
            (ids,),
        )
        for job_id, dependency, state in rows:
            state = state or model.pruned_states.get(dependency)
            assert state == "succeeded", (
                f"job {job_id} was claimed while its dependency {dependency} is {state}"
            )

    def _heartbeat(self, protocol: WorkerProtocol, worker: str, models: list[QueueModel]) -> None:
        """One beat for everything ``worker`` holds: current leases extended (expired
        or not), the others reported lost."""
        held = models[0].holdings[worker]
        lost = protocol.heartbeat([_lease(h) for h in held], LEASE_SECONDS)
        # Ids, not leases, come back: a worker that holds a stale lease of a job beside
        # the current one (it claimed the job again after its first lease was reaped)
        # hears that id is fine. The stale attempt cannot finish: its ack is refused.
        current = {h.job_id for h in held if models[0].current(h)}
        assert lost == {h.job_id for h in held if not models[0].current(h)} - current
        for model in models:
            for holding in model.holdings[worker]:
                if model.current(holding):
                    model.jobs[holding.job_id].expired = False

    def _finish(
        self,
        protocol: WorkerProtocol,
        worker: str,
        holding: Holding,
        succeed: bool,
        models: list[QueueModel],
    ) -> None:
        """``worker`` acks or fails the attempt of ``holding``: refused if stale."""
        for model in models:
            model.holdings[worker].remove(holding)
        claimed = holding.claimed
        if not models[0].current(holding):
            with pytest.raises(LeaseLost):
                protocol.ack(claimed) if succeed else protocol.fail(claimed, "boom")
            return
        try:
            if succeed:
                done = protocol.ack(claimed, {"ok": True})
            else:
                done = protocol.fail(claimed, "boom")
        except DatabaseUnavailable as exc:
            raise AssertionError(f"the outcome of job {claimed.id} waited: {exc}") from exc
        for model in models:
            if succeed:
                model.finished(claimed.id, "succeeded")
            else:
                model.failed([(claimed.id, done.run_at)])
        assert done.state.value == models[0].jobs[claimed.id].state

    def _probe(self, probe: str, models: list[QueueModel]) -> None:
        """A worker's call while a producer's transaction is open (see
        enqueue_in_callers_transaction): it sees what was committed (models[0]), and
        what it does holds after the producer commits too (models[1])."""
        if probe == "heartbeat":
            for worker in WORKERS:
                self._heartbeat(self.probe, worker, models)
        elif probe == "claim":
            for queue in QUEUES:
                self._claim(self.probe, WORKERS[0], queue, 3, models)
        else:
            assert probe == "ack"
            held = [(w, h) for w, hs in models[0].holdings.items() for h in hs]
            current = [(w, h) for w, h in held if models[0].current(h)]
            if current:
                worker, holding = current[0]
                self._finish(self.probe, worker, holding, True, models)


def _lease(holding: Holding) -> Lease:
    return Lease(holding.job_id, holding.token)
