"""A pure-Python model of pgqueue's job state machine, for the stateful test.

It knows only what the documentation promises: which transitions exist, what each one
does to a job's state and attempt count, which lease may finish an attempt, in what
order claims take runnable jobs, and how jobs that wait for other jobs are queued or
cancelled when those finish (see pgqueue.dependencies). The real queue decides run_at and lease tokens; the
model records them from what the queue returns and checks everything else.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

QUEUES = ("a", "b")
TASK = "t"
FINISHED = ("succeeded", "dead", "cancelled")
STATES = ("waiting", "queued", "running", *FINISHED)


@dataclass
class ModelJob:
    """What the model expects of one job."""

    id: int
    queue: str
    priority: int
    max_attempts: int
    run_at: datetime
    delayed: bool
    """Enqueued an hour ahead: not runnable during an example (until retried)."""
    key: str | None
    unique_key: str | None = None
    state: str = "queued"
    attempts: int = 0
    token: uuid.UUID | None = None
    expired: bool = False
    """Running with a lease whose expiry the test moved into the past."""
    pending: set[int] = field(default_factory=set)
    """While waiting: the dependencies that have not succeeded yet."""
    reason: str | None = None
    """The last_error of a job cancelled because a dependency ended dead or cancelled."""


@dataclass
class Holding:
    """A lease a logical worker holds (or believes it holds), with the job as the claim
    returned it: what the worker acks or fails, even once the job has moved on."""

    job_id: int
    token: uuid.UUID
    claimed: Any = field(compare=False, repr=False)


@dataclass
class QueueModel:
    """Every job the model knows, and what each logical worker holds."""

    jobs: dict[int, ModelJob] = field(default_factory=dict)
    holdings: dict[str, list[Holding]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    concurrency_limits: dict[str, int] = field(default_factory=dict)
    """Jobs of a queue that may run at once, across all workers (absent: no limit)."""
    edges: set[tuple[int, int]] = field(default_factory=set)
    """(dependency, dependent) pairs; they go when the dependent is pruned."""
    pruned_ids: set[int] = field(default_factory=set)
    """Ids of jobs pruned: no job any more, so refused as dependencies."""
    pruned_queues: set[str] = field(default_factory=set)
    """Queues of jobs pruned: their counters keep them known."""

    # -- queries ------------------------------------------------------------------

    def by_key(self, key: str) -> ModelJob | None:
        """The job that holds an idempotency key (keys last until the job is pruned)."""
        return next((job for job in self.jobs.values() if job.key == key), None)

    def unique_holder(self, unique_key: str, *, besides: int | None = None) -> ModelJob | None:
        """The queued or running job that holds ``unique_key``, other than ``besides``."""
        return next(
            (
                job
                for job in self.jobs.values()
                if job.unique_key == unique_key
                and job.state in ("waiting", "queued", "running")
                and job.id != besides
            ),
            None,
        )

    def runnable(self, queue: str) -> list[ModelJob]:
        """Jobs a claim on ``queue`` may take, in claim order (priority DESC, run_at, id).

        Retried jobs wait a backoff of at most a millisecond, which the test lets pass
        before each claim; delayed jobs wait an hour."""
        ready = [j for j in self.jobs.values() if j.queue == queue and j.state == "queued"]
        ready = [j for j in ready if not j.delayed]
        return sorted(ready, key=lambda j: (-j.priority, j.run_at, j.id))

    def claimable(self, queue: str, limit: int) -> list[ModelJob]:
        """What a claim of up to ``limit`` jobs from ``queue`` must take: nothing while
        the queue is paused, no more than its concurrency limit leaves room for."""
        if queue in self.paused:
            return []
        if queue in self.concurrency_limits:
            running = sum(
                1 for j in self.jobs.values() if j.queue == queue and j.state == "running"
            )
            limit = min(limit, max(0, self.concurrency_limits[queue] - running))
        return self.runnable(queue)[:limit]

    def current(self, holding: Holding) -> bool:
        """Whether ``holding`` is the lease of the job's attempt now running."""
        job = self.jobs.get(holding.job_id)
        return job is not None and job.state == "running" and job.token == holding.token

    def dependencies(self, job_id: int) -> tuple[list[int], list[int]]:
        """What Queue.dependencies(job_id) must say: (depends_on, dependents)."""
        return (
            sorted(d for d, j in self.edges if j == job_id),
            sorted(j for d, j in self.edges if d == job_id),
        )

    def counts(self, queue: str) -> dict[str, int]:
        """Jobs per state in ``queue``."""
        counts = dict.fromkeys(STATES, 0)
        for job in self.jobs.values():
            if job.queue == queue:
                counts[job.state] += 1
        return counts

    # -- transitions ----------------------------------------------------------------

    def enqueued(self, job: ModelJob, depends_on: set[int]) -> None:
        """A job just created with ``depends_on`` (ids of known jobs): waiting for the
        ones that have not succeeded, cancelled at once if one is dead or cancelled."""
        self.jobs[job.id] = job
        self.edges |= {(dependency, job.id) for dependency in depends_on}
        job.pending = {d for d in depends_on if self.jobs[d].state != "succeeded"}
        job.state = "waiting" if job.pending else "queued"
        failed = sorted(d for d in depends_on if self.jobs[d].state in ("dead", "cancelled"))
        if failed:
            self._cancel_dependents(failed)

    def expected_state(self, depends_on: set[int]) -> str:
        """The state a job created now with ``depends_on`` starts in."""
        states = {self.jobs[d].state for d in depends_on}
        if states & {"dead", "cancelled"}:
            return "cancelled"
        return "waiting" if states - {"succeeded"} else "queued"

    def _cancel_dependents(self, ended: list[int]) -> None:
        """Cancel the waiting dependents of ``ended`` (jobs now dead or cancelled), one
        level at a time; each names the lowest id among its ended dependencies of that
        level."""
        level = sorted(ended)
        while level:
            doomed: dict[int, int] = {}
            for dependency, dependent in sorted(self.edges):
                if dependency in level and self.jobs[dependent].state == "waiting":
                    doomed.setdefault(dependent, dependency)
            for dependent, dependency in doomed.items():
                job = self.jobs[dependent]
                job.state, job.pending = "cancelled", set()
                job.reason = f"dependency {dependency} ended {self.jobs[dependency].state}"
            level = sorted(doomed)

    def _released(self, dependency: int) -> None:
        """``dependency`` succeeded: its waiting dependents count it off."""
        for d, dependent in self.edges:
            job = self.jobs[dependent]
            if d == dependency and job.state == "waiting":
                job.pending.discard(dependency)
                if not job.pending:
                    job.state = "queued"

    def claimed(self, worker: str, claimed: Any) -> None:
        """``claimed``: the Job a claim returned to ``worker``."""
        job = self.jobs[claimed.id]
        job.state, job.attempts, job.expired = "running", job.attempts + 1, False
        job.token = claimed.lease_token
        self.holdings.setdefault(worker, []).append(Holding(job.id, job.token, claimed))

    def failed(self, job_id: int, run_at: datetime) -> None:
        """A failed attempt (by its worker, or an expired lease reaped)."""
        job = self.jobs[job_id]
        job.token, job.expired = None, False
        if job.attempts >= job.max_attempts:
            job.state = "dead"
            self._cancel_dependents([job_id])
        else:
            job.state, job.run_at = "queued", run_at

    def finished(self, job_id: int, state: str) -> None:
        job = self.jobs[job_id]
        job.state, job.token, job.expired = state, None, False
        if state == "succeeded":
            self._released(job_id)
        else:
            self._cancel_dependents([job_id])

    def retried(self, job_id: int, run_at: datetime) -> None:
        job = self.jobs[job_id]
        job.state, job.attempts, job.run_at, job.delayed = "queued", 0, run_at, False
        # It runs without waiting: the dependents it cancelled stay cancelled, and the
        # dependencies it waited for no longer hold it.
        job.pending, job.reason = set(), None

    def pruned(self) -> None:
        """Every finished job goes, and with it its idempotency key and the edges to
        the jobs it depended on (not those from the jobs it was a dependency of)."""
        gone = {i for i, j in self.jobs.items() if j.state in FINISHED}
        self.pruned_ids |= gone
        self.pruned_queues |= {self.jobs[i].queue for i in gone}
        self.jobs = {i: j for i, j in self.jobs.items() if i not in gone}
        self.edges = {(d, j) for d, j in self.edges if j not in gone}
