"""A pure-Python model of pgqueue's job state machine, for the stateful test.

It knows only what the documentation promises: which transitions exist, what each one
does to a job's state and attempt count, which lease may finish an attempt, in what
order claims take runnable jobs, how jobs that wait for other jobs are queued or
cancelled when those finish (see pgqueue.dependencies), which queues a claim may take
from (paused, limited), which finished jobs a pruning round removes from the history's
day partitions, and what a schedule's tick enqueues. The real queue decides run_at and
lease tokens; the model records them from what the queue returns and checks everything
else.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

QUEUES = ("a", "b")
FLOW_QUEUE = "k"
"""The queue of jobs with partition keys (rules_flow.py): claimed on its own."""
PARTITIONS = ("p0", "p1", "p2")
TASK = "t"
FINISHED = ("succeeded", "dead", "cancelled")
STATES = ("waiting", "queued", "running", *FINISHED)
PAST_DAYS = (1, 2, 3)
"""The past days (counted back from today, UTC) whose history partitions an example
creates, as a pruner that has run for days would have; a job moved further back than
these lands in its state's DEFAULT partition."""


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
    expired_order: int = 0
    """When it expired, counted in expiries: the reaper takes the oldest first."""
    pending: set[int] = field(default_factory=set)
    """While waiting: the dependencies that have not succeeded yet."""
    reason: str | None = None
    """The last_error of a job cancelled because a dependency ended dead or cancelled
    (None: not checked)."""
    poison: str | None = None
    """A row written around pgqueue whose payload Python cannot decode: how."""
    age: int = 0
    """Days its history was moved back while finished (0: it finished today)."""
    in_default: bool = False
    """Moved back to a day that has no partition: its row is in the DEFAULT one."""
    shifted: bool = False
    """Its started_at was moved back with its history, until it is claimed again."""
    finished_mode: bool = False
    """Enqueued with dependency_mode="finished": it waits for its dependencies to be
    final in any state, and is never cancelled by them."""
    partition: str | None = None
    """Its partition key."""
    snoozed: bool = False
    """Put back by a handler's Throttle, runnable an hour later (until the test lets
    the throttles end)."""


@dataclass
class ModelSchedule:
    """A schedule as declared (always a yearly cron: it never comes due by itself)."""

    queue: str
    priority: int
    max_attempts: int | None
    """As declared (None: the jobs' default)."""
    enabled: bool = True


@dataclass
class Holding:
    """A lease a logical worker holds (or believes it holds), with the job as the claim
    returned it: what the worker acks or fails, even once the job has moved on."""

    job_id: int
    token: uuid.UUID
    claimed: Any = field(compare=False, repr=False)

    def __deepcopy__(self, memo: dict[int, Any]) -> Holding:
        # A copy of the model (a producer's tentative view) shares the claimed Job: it
        # is immutable, and it carries the attempt's owner (the claim's WorkerProtocol,
        # with its pool), which job.complete needs and which cannot be copied.
        return Holding(self.job_id, self.token, self.claimed)


@dataclass
class QueueModel:
    """Every job the model knows, and what each logical worker holds."""

    jobs: dict[int, ModelJob] = field(default_factory=dict)
    holdings: dict[str, list[Holding]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    concurrency_limits: dict[str, int] = field(default_factory=dict)
    """Jobs of a queue that may run at once, across all workers (absent: no limit)."""
    starved: set[str] = field(default_factory=set)
    """Queues whose rate limit is so low that their bucket holds no whole token during
    an example: nothing is claimed from them. (The other rate the test sets is so high
    that it never limits a claim.)"""
    edges: set[tuple[int, int]] = field(default_factory=set)
    """(dependency, dependent) pairs; they go when the dependent is pruned."""
    pruned_states: dict[int, str] = field(default_factory=dict)
    """Jobs pruned, with the state they ended in: no job any more, so refused as
    dependencies, but a dependent that names one still counts it met if it succeeded."""
    pruned_queues: set[str] = field(default_factory=set)
    """Queues of jobs pruned: their counters keep them known."""
    schedules: dict[str, ModelSchedule] = field(default_factory=dict)
    """The schedules declared, by name."""
    past_days: set[tuple[str, int]] = field(default_factory=set)
    """(state, days back) of the past day partitions that exist."""
    expiries: int = 0
    """Leases expired so far."""
    revived: set[int] = field(default_factory=set)
    partition_limits: dict[str, int] = field(default_factory=dict)
    """Jobs of one partition key of a queue that may run at once (absent: no limit)."""
    throttled_queues: set[str] = field(default_factory=set)
    """Queues whose throttle has not ended: nothing is claimed from them."""
    throttled_keys: set[tuple[str, str]] = field(default_factory=set)
    """(queue, partition key) whose throttle has not ended: skipped by claims."""
    turns: dict[str, str] = field(default_factory=dict)
    """Per queue, the partition key its last claim of keyed jobs served last."""
    """Jobs retried at least once: a dependent in "finished" mode released before such
    a retry may run beside its dependency's new attempt."""

    # -- queries ------------------------------------------------------------------

    @property
    def pruned_ids(self) -> set[int]:
        return set(self.pruned_states)

    def by_key(self, key: str) -> ModelJob | None:
        """The job that holds an idempotency key (keys last until the job is pruned)."""
        return next((job for job in self.jobs.values() if job.key == key), None)

    def unique_holder(self, unique_key: str, *, besides: int | None = None) -> ModelJob | None:
        """The waiting, queued or running job that holds ``unique_key``, other than
        ``besides``."""
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
        before each claim; delayed (and snoozed) jobs wait an hour."""
        ready = [j for j in self.jobs.values() if j.queue == queue and j.state == "queued"]
        ready = [j for j in ready if not j.delayed and not j.snoozed]
        return sorted(ready, key=lambda j: (-j.priority, j.run_at, j.id))

    def claimable(self, queue: str, limit: int) -> list[ModelJob]:
        """What a claim of up to ``limit`` jobs from ``queue`` must take, in claim order:
        nothing while the queue is paused, throttled or starved by its rate limit, no
        more than its concurrency limit leaves room for.

        Claim order: priority first; within a priority, one job per lane per round,
        the jobs without a key a lane of their own served first, then the keys in text
        order after the one the queue's last claim served (wrapping); within a lane,
        run_at then id. Keys throttled or at their partition concurrency limit are
        passed over, and none gives more than its limit leaves room for."""
        if queue in self.paused or queue in self.starved or queue in self.throttled_queues:
            return []
        if queue in self.concurrency_limits:
            limit = min(limit, max(0, self.concurrency_limits[queue] - self.running(queue)))
        room: dict[str | None, int] = {}
        ranked = []
        rounds: dict[tuple[str | None, int], int] = {}
        for job in self.runnable(queue):
            key = job.partition
            if key is not None and key not in room:
                room[key] = self._key_room(queue, key)
            lane = (key, job.priority)
            rounds[lane] = rounds.get(lane, 0) + 1
            ranked.append((-job.priority, rounds[lane], self._place(queue, key), job))
        ranked.sort(key=lambda r: (r[0], r[1], r[2], r[3].run_at, r[3].id))
        taken = []
        for *_, job in ranked:
            if len(taken) == limit:
                break
            if job.partition is not None:
                if room[job.partition] <= 0:
                    continue
                room[job.partition] -= 1
            taken.append(job)
        return taken

    def running(self, queue: str, partition: str | None = None) -> int:
        """Running jobs of ``queue`` (of one partition key, if given)."""
        return sum(
            1
            for j in self.jobs.values()
            if j.queue == queue
            and j.state == "running"
            and (partition is None or j.partition == partition)
        )

    def _key_room(self, queue: str, key: str) -> int:
        if (queue, key) in self.throttled_keys:
            return 0
        if queue not in self.partition_limits:
            return 2**31
        return max(0, self.partition_limits[queue] - self.running(queue, key))

    def _place(self, queue: str, key: str | None) -> tuple[int, str]:
        """A lane's place in a round: the keyless lane first, then the keys after the
        queue's turn, then (wrapped) those up to it."""
        if key is None:
            return (0, "")
        turn = self.turns.get(queue)
        return (1 if turn is None or key > turn else 2, key)

    def reapable(self, limit: int) -> list[int]:
        """The running jobs a reaper round of up to ``limit`` takes: expired leases,
        oldest expiry first."""
        expired = [j for j in self.jobs.values() if j.state == "running" and j.expired]
        return [j.id for j in sorted(expired, key=lambda j: j.expired_order)][:limit]

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

    def state_of(self, job_id: int) -> str:
        """The state of a job, or the one a pruned job ended in."""
        job = self.jobs.get(job_id)
        return job.state if job is not None else self.pruned_states[job_id]

    def unmet(self, job_id: int) -> set[int]:
        """The dependencies of ``job_id`` that have not succeeded (in "finished" mode:
        that are not final)."""
        met = FINISHED if self.jobs[job_id].finished_mode else ("succeeded",)
        return {d for d, j in self.edges if j == job_id and self.state_of(d) not in met}

    def counts(self, queue: str) -> dict[str, int]:
        """Jobs per state in ``queue``."""
        counts = dict.fromkeys(STATES, 0)
        for job in self.jobs.values():
            if job.queue == queue:
                counts[job.state] += 1
        return counts

    def expected_state(self, depends_on: set[int], finished_mode: bool = False) -> str:
        """The state a job created now with ``depends_on`` starts in."""
        states = {self.jobs[d].state for d in depends_on}
        if finished_mode:
            return "waiting" if states - set(FINISHED) else "queued"
        if states & {"dead", "cancelled"}:
            return "cancelled"
        return "waiting" if states - {"succeeded"} else "queued"

    def retry_outcomes(self, job_id: int) -> tuple[str, ...]:
        """The states a retry of ``job_id`` (dead or cancelled) may leave it in; none
        when the retry is refused.

        A job waits until everything it names has succeeded, retried or not: with a
        dependency that has not, it goes back to waiting. With one that ended dead or
        cancelled, the retry is refused (it would only be cancelled again at once), and
        the job stays as it was; what it must never be is queued."""
        unmet = self.unmet(job_id)
        if not unmet:
            return ("queued",)
        if self.failed_dependencies(job_id):
            return ()
        return ("waiting",)

    def failed_dependencies(self, job_id: int) -> set[int]:
        """The dependencies of ``job_id`` that ended dead or cancelled (none count in
        "finished" mode, where an end in any state is met)."""
        if self.jobs[job_id].finished_mode:
            return set()
        return {d for d in self.unmet(job_id) if self.state_of(d) in ("dead", "cancelled")}

    def removed_by_retention(
        self, retention: dict[str, int]
    ) -> tuple[set[int], set[tuple[str, int]]]:
        """What a pruning round with ``retention`` (days kept, per finished state; states
        left out are kept forever) removes: the finished jobs, and the past days dropped.

        A day goes once its end is at least its state's retention ago: a day d days back
        ends (d - 1) days and a fraction ago, so it goes when d - 1 >= retention. A job in
        a DEFAULT partition goes once it finished longer ago than the retention: moved d
        days back from a moment ago, when d >= retention. Today's days are never
        dropped."""
        dropped = {
            (state, days)
            for state, days in self.past_days
            if state in retention and days - 1 >= retention[state]
        }
        gone = set()
        for job in self.jobs.values():
            if job.state not in FINISHED or job.state not in retention or job.age == 0:
                continue
            if job.in_default:
                if job.age >= retention[job.state]:
                    gone.add(job.id)
            elif (job.state, job.age) in dropped:
                gone.add(job.id)
        return gone, dropped

    # -- transitions ----------------------------------------------------------------

    def enqueued(self, job: ModelJob, depends_on: set[int]) -> None:
        """A job just created with ``depends_on`` (ids of known jobs): waiting for the
        ones that have not succeeded, cancelled at once if one is dead or cancelled."""
        self.jobs[job.id] = job
        self.edges |= {(dependency, job.id) for dependency in depends_on}
        job.pending = self.unmet(job.id)
        job.state = "waiting" if job.pending else "queued"
        failed = sorted(d for d in depends_on if self.jobs[d].state in ("dead", "cancelled"))
        if failed and not job.finished_mode:
            self._cancel_dependents(failed)

    def _cancel_dependents(self, ended: list[int]) -> None:
        """Cancel the waiting dependents of ``ended`` (jobs now dead or cancelled), one
        level at a time; each names the lowest id among its ended dependencies of that
        level."""
        level = sorted(ended)
        while level:
            doomed: dict[int, int] = {}
            for dependency, dependent in sorted(self.edges):
                if dependency in level and self.jobs[dependent].state == "waiting":
                    if self.jobs[dependent].finished_mode:
                        self._counted_off(dependent, dependency)
                    else:
                        doomed.setdefault(dependent, dependency)
            for dependent, dependency in doomed.items():
                job = self.jobs[dependent]
                job.state, job.pending = "cancelled", set()
                job.reason = f"dependency {dependency} ended {self.jobs[dependency].state}"
            level = sorted(doomed)

    def _released(self, dependency: int) -> None:
        """``dependency`` succeeded: its waiting dependents count it off."""
        for d, dependent in self.edges:
            if d == dependency and self.jobs[dependent].state == "waiting":
                self._counted_off(dependent, dependency)

    def _counted_off(self, dependent: int, dependency: int) -> None:
        """The waiting ``dependent`` has ``dependency`` met: queued once none is left."""
        job = self.jobs[dependent]
        job.pending.discard(dependency)
        if not job.pending:
            job.state = "queued"

    def claimed(self, worker: str | None, claimed: Any) -> None:
        """``claimed``: the Job a claim returned to ``worker`` (None: a claim that
        refused it, as a job whose payload cannot be decoded)."""
        job = self.jobs[claimed.id]
        job.state, job.attempts, job.expired = "running", job.attempts + 1, False
        job.token, job.shifted = claimed.lease_token, False
        if worker is not None:
            self.holdings.setdefault(worker, []).append(Holding(job.id, job.token, claimed))

    def lease_expired(self, job_id: int) -> None:
        """The running job's lease expired (its worker stopped heartbeating)."""
        self.expiries += 1
        job = self.jobs[job_id]
        job.expired, job.expired_order = True, self.expiries

    def refused(self, outcomes: list[tuple[int, datetime]]) -> None:
        """A claim took these jobs and failed their attempts at once, in one statement
        (their payloads cannot be decoded), as a worker's failures would be: ``outcomes``
        as for :meth:`failed`."""
        for job_id, _ in outcomes:
            job = self.jobs[job_id]
            job.attempts, job.shifted = job.attempts + 1, False
        self.failed(outcomes)

    def failed(self, outcomes: list[tuple[int, datetime]]) -> None:
        """Failed attempts written by one statement (a worker's, or a reaper round's),
        each (job id, the run_at it was given): a job whose attempts are used up is
        dead, the others are queued again. The waiting dependents of the jobs that died
        are cancelled together, level by level, as the statement's cascade does."""
        died = []
        for job_id, run_at in outcomes:
            job = self.jobs[job_id]
            job.token, job.expired = None, False
            if job.attempts >= job.max_attempts:
                job.state = "dead"
                died.append(job_id)
            else:
                job.state, job.run_at = "queued", run_at
        if died:
            self._cancel_dependents(died)

    def finished(self, job_id: int, state: str) -> None:
        job = self.jobs[job_id]
        job.state, job.token, job.expired = state, None, False
        if state == "succeeded":
            self._released(job_id)
        else:
            self._cancel_dependents([job_id])

    def retried(self, job_id: int, run_at: datetime, state: str) -> None:
        """A retry that left the job in ``state``, one of :meth:`retry_outcomes`."""
        job = self.jobs[job_id]
        job.attempts, job.run_at, job.delayed, job.snoozed = 0, run_at, False, False
        job.age, job.in_default, job.reason = 0, False, None
        job.state, job.pending = state, set()
        self.revived.add(job_id)
        # Its dependents in "finished" mode that still wait counted it off when it
        # ended: they wait for it again.
        for d, dependent in self.edges:
            waiting = self.jobs[dependent]
            if d == job_id and waiting.finished_mode and waiting.state == "waiting":
                waiting.pending.add(job_id)
        if state == "waiting":
            job.pending = self.unmet(job_id)
        elif state == "cancelled":
            # Cancelled again by the cascade: so are the jobs that wait for it.
            self._cancel_dependents([job_id])

    def pruned(self, ids: set[int] | None = None) -> None:
        """Jobs ``ids`` (every finished job if None) go, and with them their idempotency
        keys and the edges to the jobs they depended on (not those from the jobs they
        were a dependency of)."""
        gone = {i for i, j in self.jobs.items() if j.state in FINISHED} if ids is None else ids
        self.pruned_states |= {i: self.jobs[i].state for i in gone}
        self.pruned_queues |= {self.jobs[i].queue for i in gone}
        self.jobs = {i: j for i, j in self.jobs.items() if i not in gone}
        self.edges = {(d, j) for d, j in self.edges if j not in gone}

    def aged(self, job_id: int, days: int) -> None:
        """A finished job's history moved ``days`` back: into that day's partition, or
        its state's DEFAULT one if that day has none."""
        job = self.jobs[job_id]
        job.age, job.shifted = days, True
        job.in_default = (job.state, days) not in self.past_days
