"""Jobs that wait for other jobs: ``depends_on``.

A job enqueued with ``depends_on=[ids]`` is **waiting** until every one of those jobs
has succeeded, then **queued** like any other, by the transaction that acks the last
of them. A dependency that already succeeded counts as met at once; one that ends
**dead** or **cancelled** cancels its waiting dependents, with a ``last_error`` naming
it (``dependency 12 ended dead``), and theirs in turn. A dependency that fails an
attempt and is retried by its backoff is not finished: its dependents keep waiting.
An id that is no job (never was, or pruned) is refused:
:class:`~pgqueue.errors.UnknownDependencies`, and nothing is enqueued.

Retrying a job with dependencies (``pgqueue retry``) makes it wait again for those that
have not succeeded, counted anew, and queues it at once if they all have. If one of
them ended dead or cancelled the retry is refused
(:class:`~pgqueue.errors.DependenciesFailed`, naming them): it would only be cancelled
again. Retry them first; retrying a dead dependency does not bring back the dependents
it cancelled, which are retried one by one in turn.

With ``dependency_mode="finished"`` a job waits for its dependencies to be **final in
any state** (succeeded, dead or cancelled) instead: a dependency that ends dead or
cancelled counts as met, as an ack does, and never cancels it. It is a callback for a
group (a chord, a batch callback). A retry of such a job waits again for those of its
dependencies that are not final, and is never refused by them.

A running job finds what it waited for in ``job.dependencies``
(:class:`Dependency`: id, task, state, result), in the order ``depends_on`` named them,
loaded by the worker with the claim (one more statement for a claim that took jobs with
dependencies, none for one that took none). A dependency pruned since is still there,
with ``pruned`` set and no task or result (see :class:`Dependency`).

In a batch (``enqueue_many``, ``POST /jobs/batch``) an item may depend on an earlier
item of the same batch by its position: ``BatchItem(0)`` in Python, ``{"index": 0}``
over HTTP.

How it stays exact under concurrency, while a producer's transaction holds nothing its
dependencies need, however long it stays open:

- The enqueue reads each dependency's state without locking anything, inserts the job
  (waiting, with a provisional count of its unmet dependencies; queued when they all
  succeeded, which is final), links it to them, and records the waiting job in
  ``dependents_to_check``. The dependencies' heartbeats, acks, claims and reaping go on
  as if the enqueue had not happened, which to them it has not: nothing of it is
  visible before the commit.
- A ``DEFERRABLE INITIALLY DEFERRED`` constraint trigger on that table runs
  ``dependents_checked`` (``sql/schema.sql``) as the transaction commits. It locks the
  dependencies still in ``active_jobs``, in id order, and marks them
  (``has_dependents``): an ack of one under way is waited for, an ack that comes later
  waits for the commit, so the rows are held for the commit alone. Then, in new
  statements (new snapshots, which see every ack those waits let commit), it cancels
  the jobs with a dependency that ended dead or cancelled, and sets every other one's
  count from scratch: the dependencies still in ``active_jobs``. The enqueue's count is
  replaced, never adjusted, so nothing is counted twice: a dependency acked between the
  enqueue's read and the commit is met, one acked after the commit is counted off by
  its ack.
- The ack reads the mark from the rows it deletes and, only when one of them has
  dependents, calls ``dependents_released`` from within its statement. The function's
  own statement takes a new snapshot (so it sees the dependents of a commit the ack
  waited for) and counts each waiting dependent's ``pending_dependencies`` down with a
  row update: two acks of a job's last two dependencies take turns on its row, and
  exactly one of them queues it.
- Cancelling dependents goes one level per statement, for the same reason.

An ack whose jobs have no dependents pays nothing for this: no statement, no call; nor
does an enqueue without dependencies (the trigger is on a table only they write).

Why at the commit. Marking the dependencies as the enqueue ran, as pgqueue did before,
held their rows for the producer's whole transaction: heartbeats skipped them (a
heartbeat never waits for a row) so their leases ran out, the reaper skipped them, and
their acks waited for the producer. A sweep by the reaper of the dependents whose
dependencies finished would release them late and cost every sweep a scan of the
waiting jobs; the check at the commit is exact at once and costs only the producer.

A transaction of pgqueue's own (an enqueue without ``conn`` or on an autocommit
connection, a retry) runs the check itself just before it commits, so that the jobs it
returns are as committed; the trigger then finds nothing left to check. In a caller's
transaction the jobs returned are as enqueued: the commit may queue a waiting one (its
dependencies succeeded meanwhile) or cancel it. Two things the caller's transaction
should not do: ``SET CONSTRAINTS ALL IMMEDIATE`` runs the check at once, and the
dependencies' rows then stay locked until the commit; and under ``REPEATABLE READ`` or
``SERIALIZABLE`` the check reads the transaction's snapshot, so a dependency that
changed since (a heartbeat) fails the commit with a serialization error, to be retried
like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg

from pgqueue import keyed, queries
from pgqueue.errors import IdempotencyMismatch, UnknownDependencies, ValidationError
from pgqueue.job import EnqueueResult, Job, JobState

if TYPE_CHECKING:
    from pgqueue.job_spec import JobSpec

MAX_DEPENDENCIES = 10_000
"""The most dependencies one job may name: a larger fan-in can wait on a job that
itself waits for a share of them."""
FAILED_STATES = ("dead", "cancelled")
"""The states of a dependency that will not succeed (unless retried)."""
FINAL_STATES = ("succeeded", *FAILED_STATES)
DEPENDENCY_MODES = ("succeeded", "finished")
"""What ``depends_on`` waits for: each dependency to succeed (the default), or to be
final in any state."""


@dataclasses.dataclass(frozen=True)
class Dependency:
    """A job that a running job depended on, as its claim found it (``job.dependencies``)."""

    id: int
    task: str | None
    """None when it was pruned."""
    state: str
    """``succeeded``, ``dead`` or ``cancelled`` (or ``waiting``, ``queued``, ``running``
    for one retried since it was counted). For a dependency that was pruned:
    ``succeeded`` when the job waited in ``"succeeded"`` mode (nothing else released
    it), and ``pruned`` in ``"finished"`` mode, where it may have ended in any state."""
    result: Any
    """What its handler returned, when it succeeded and was not pruned; None otherwise."""
    pruned: bool = False
    """True when its row is gone (see :mod:`pgqueue.pruning`): its task and result are
    lost, and its state is known only as :attr:`state` says."""


@dataclasses.dataclass(frozen=True)
class BatchItem:
    """In ``depends_on``, an earlier item of the same ``enqueue_many`` call, by its
    position (from 0): the job that item created or returned."""

    index: int


class JobDependencies(NamedTuple):
    """Both directions of a job's dependencies, ids ascending."""

    depends_on: list[int]
    """The jobs it waits (or waited) for."""
    dependents: list[int]
    """The jobs that wait (or waited) for it."""
    dependency_mode: str = "succeeded"
    """What it waits for in ``depends_on``: see :data:`DEPENDENCY_MODES`."""


WORKFLOW_LIMIT = 100
"""How many ancestors, and how many descendants, :meth:`pgqueue.Queue.workflow` finds
of a job at most, nearest first: a graph of 201 jobs at most."""
NEIGHBOURS_LIMIT = 100
"""How many of its dependencies, and of its dependents, :meth:`pgqueue.Queue.neighbours`
returns for a job at most."""


@dataclasses.dataclass(frozen=True)
class LinkedJob:
    """A job as a graph of dependencies shows it."""

    id: int
    task: str | None
    """None when the job was pruned (a job that is not still names it)."""
    queue: str | None
    state: JobState | None
    """None when the job was pruned."""


@dataclasses.dataclass(frozen=True)
class JobNeighbours:
    """The jobs a job depends on and those that depend on it, ids ascending, each with its
    state: the first :data:`NEIGHBOURS_LIMIT` each way, and how many there are."""

    depends_on: list[LinkedJob]
    dependents: list[LinkedJob]
    depends_on_total: int
    dependents_total: int


@dataclasses.dataclass(frozen=True)
class WorkflowJob(LinkedJob):
    """A job of a :class:`Workflow`, with its links."""

    depends_on: tuple[int, ...] = ()
    """Its dependencies in the workflow, ids ascending."""
    more_dependencies: int = 0
    """Of an ancestor: its dependencies left out, the graph being cut there."""
    more_dependents: int = 0
    """Of a descendant: its dependents left out, the graph being cut there."""


@dataclasses.dataclass(frozen=True)
class Workflow:
    """The graph around a job: the job, every job it depends on directly or not, and every
    job that depends on it directly or not, up to ``limit`` each way, nearest first."""

    job_id: int
    jobs: list[WorkflowJob]
    """Ids ascending; the job itself among them."""
    limit: int

    @property
    def edges(self) -> list[tuple[int, int]]:
        """(dependency, dependent) pairs, in the order of ``jobs``."""
        return [(dependency, job.id) for job in self.jobs for dependency in job.depends_on]

    @property
    def truncated(self) -> bool:
        """True when ancestors or descendants were left out (more than ``limit``)."""
        return any(job.more_dependencies or job.more_dependents for job in self.jobs)


def has_dependencies(spec: JobSpec) -> bool:
    """True for a spec that must take this module's path."""
    return bool(spec.dependencies)


def checked(value: object) -> tuple[int | BatchItem, ...]:
    """``depends_on`` as a tuple of job ids and :class:`BatchItem`, each once, in the
    order given; ValidationError for anything else."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ValidationError("depends_on", "must be a list of job ids")
    items = tuple(dict.fromkeys(value))
    if len(items) > MAX_DEPENDENCIES:
        raise ValidationError("depends_on", f"at most {MAX_DEPENDENCIES:,} dependencies")
    for item in items:
        if isinstance(item, BatchItem):
            if isinstance(item.index, bool) or not isinstance(item.index, int) or item.index < 0:
                raise ValidationError("depends_on", f"{item!r}: index must be an integer >= 0")
        elif isinstance(item, bool) or not isinstance(item, int) or not 1 <= item < 2**63:
            raise ValidationError("depends_on", f"{item!r} is not a job id")
    return items


def check_batch_items(specs: Sequence[JobSpec]) -> None:
    """Refuse a :class:`BatchItem` that does not name an earlier item of ``specs``."""
    for index, spec in enumerate(specs):
        for dependency in spec.dependencies:
            if isinstance(dependency, BatchItem) and not 0 <= dependency.index < index:
                raise ValidationError(
                    "depends_on",
                    f"item {index}: index {dependency.index} is not an earlier item of the batch",
                )


def insert_with_dependencies(
    cur: psycopg.Cursor[dict[str, Any]],
    schema: str,
    specs: Sequence[JobSpec],
    trace_context: str | None,
    *,
    check_now: bool,
) -> tuple[list[EnqueueResult], list[IdempotencyMismatch]]:
    """Enqueue ``specs``, some with ``depends_on``, on ``cur`` (a dict-row jsonb cursor)
    in its connection's transaction, in order: the items without dependencies between
    two that have some go in together. Returns what
    :func:`pgqueue.keyed.insert_keyed` returns, for the whole batch; with idempotency
    conflicts, the jobs are inserted but not linked, for the caller to take back or
    roll back.

    Nothing is locked: the transaction checks the waiting jobs as it commits, or now,
    with ``check_now``, in a transaction of pgqueue's own that commits next."""
    states = _named_states(cur, schema, specs)
    results: list[EnqueueResult] = []
    conflicts: list[IdempotencyMismatch] = []
    links: dict[int, list[int]] = {}  # each job created with dependencies: their ids
    finishing: set[int] = set()  # those of them in "finished" mode
    waiting: list[int] = []
    failed: dict[int, str] = {}
    for start, group in _groups(specs):
        if has_dependencies(group[0]):
            spec = group[0]
            for dependency in spec.dependencies:
                if isinstance(dependency, BatchItem):
                    job = results[dependency.index].job
                    states[job.id] = job.state.value
            # In the order given (a batch item and its job's id may both be named).
            ids = list(dict.fromkeys(_resolve(d, results) for d in spec.dependencies))
            finished_mode = spec.dependency_mode == "finished"
            met = FINAL_STATES if finished_mode else (JobState.SUCCEEDED.value,)
            unmet = [i for i in ids if states[i] not in met]
            done, mismatches = keyed.insert_keyed(
                cur, schema, [spec], trace_context, pending_dependencies=[len(unmet)]
            )
            result = done[0]
            if result.created:
                links[result.job.id] = ids
                if finished_mode:
                    finishing.add(result.job.id)
                if result.job.state is JobState.WAITING:
                    waiting.append(result.job.id)
                failed.update((i, states[i]) for i in unmet if states[i] in FAILED_STATES)
            results.append(result)
            conflicts += [dataclasses.replace(m, index=start) for m in mismatches]
        else:
            done, mismatches = keyed.insert_keyed(cur, schema, group, trace_context)
            results += done
            conflicts += [dataclasses.replace(m, index=start + m.index) for m in mismatches]
    if conflicts:
        return results, conflicts
    if links:
        pairs = [
            (dependency, job_id, position)
            for job_id, ids in links.items()
            for position, dependency in enumerate(ids)
        ]
        cur.execute(
            queries.bind("job_dependencies_insert", schema),
            {
                "depends_on": [dependency for dependency, _, _ in pairs],
                "job_ids": [job_id for _, job_id, _ in pairs],
                "positions": [position for _, _, position in pairs],
                "finished_modes": [job_id in finishing for _, job_id, _ in pairs],
                "waiting": waiting,
            },
        )
    # A job whose dependency already ended dead or cancelled is cancelled at once, and
    # so are the items of the batch that wait for it.
    counted: list[Job] = []
    changed = cancel_dependents(
        cur, schema, sorted(failed.items()), among=list(links), released=counted
    )
    changed += counted
    if check_now and waiting:
        changed += checked_now(cur, schema)
    return _updated(results, changed), []


def checked_now(cur: psycopg.Cursor[dict[str, Any]], schema: str) -> list[Job]:
    """Check the waiting jobs this transaction enqueued or retried now, as its commit
    would (see ``dependents_checked``), in a transaction of pgqueue's own that commits
    next: the jobs that changed (queued, counted anew, or cancelled), as they now are."""
    cur.execute(queries.bind("dependents_check", schema))
    ids = [row["job_id"] for row in cur.fetchall()]
    if not ids:
        return []
    cur.execute(queries.bind("job_get_many", schema), {"ids": ids})
    return [Job.from_row(row) for row in cur.fetchall()]


def _updated(results: list[EnqueueResult], changed: Sequence[Job]) -> list[EnqueueResult]:
    """``results`` with the jobs in ``changed`` as they are now."""
    now = {job.id: job for job in changed}
    return [
        EnqueueResult(now[result.job.id], result.created) if result.job.id in now else result
        for result in results
    ]


def _groups(specs: Sequence[JobSpec]) -> Iterator[tuple[int, list[JobSpec]]]:
    """``specs`` cut into runs to insert together, with the index each run starts at:
    each item with dependencies alone, the items between them together."""
    run: list[JobSpec] = []
    start = 0
    for index, spec in enumerate(specs):
        if has_dependencies(spec):
            if run:
                yield start, run
            yield index, [spec]
            run, start = [], index + 1
        else:
            run.append(spec)
    if run:
        yield start, run


def _resolve(dependency: int | BatchItem, results: list[EnqueueResult]) -> int:
    if isinstance(dependency, BatchItem):
        return results[dependency.index].job.id
    return dependency


def _named_states(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, specs: Sequence[JobSpec]
) -> dict[int, str]:
    """The state of every dependency ``specs`` name by id, read in one statement without
    locking anything. Raises UnknownDependencies, before anything is written, for ids
    that are no job."""
    named = sorted({d for spec in specs for d in spec.dependencies if not isinstance(d, BatchItem)})
    if not named:
        return {}
    cur.execute(queries.bind("job_dependency_states", schema), {"ids": named})
    states = {row["id"]: row["state"] for row in cur.fetchall() if row["state"]}
    missing = [i for i in named if i not in states]
    if missing:
        first = next(
            index
            for index, spec in enumerate(specs)
            if any(dependency in missing for dependency in spec.dependencies)
        )
        raise UnknownDependencies(missing, index=first if len(specs) > 1 else None)
    return states


def cancel_dependents(
    cur: psycopg.Cursor[dict[str, Any]],
    schema: str,
    failed: Sequence[tuple[int, str]],
    *,
    among: Sequence[int] | None = None,
    released: list[Job] | None = None,
) -> list[Job]:
    """Cancel the waiting jobs that depend on ``failed`` ((id, state) of jobs that
    ended dead or cancelled), and theirs in turn, in ``cur``'s transaction: the jobs
    cancelled, nearest first. With ``among``, only those of these jobs: an enqueue's
    own, which are marked as having dependents only as their transaction commits, so
    each level goes on from all of them.

    Dependents in ``"finished"`` mode are not cancelled but counted down, and queued
    when none is left; those that changed so are appended to ``released``."""
    cancelled: list[Job] = []
    level = list(failed)
    while level:
        cur.execute(
            queries.bind("job_dependents_cancel", schema),
            {
                "ids": [i for i, _ in level],
                "states": [s for _, s in level],
                "among": None if among is None else list(among),
            },
        )
        found: list[dict[str, Any]] = cur.fetchall()
        rows = [row for row in found if not row["released"]]
        if released is not None:
            released += [Job.from_row(row) for row in found if row["released"]]
        jobs = [Job.from_row(row) for row in rows]
        cancelled += jobs
        level = [
            (row["id"], "cancelled") for row in rows if row["has_dependents"] or among is not None
        ]
    return cancelled


def failed_dependencies(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, job_id: int
) -> list[tuple[int, str]]:
    """The dependencies of ``job_id`` that ended dead or cancelled: (id, state), ids
    ascending."""
    cur.execute(queries.bind("job_dependencies_failed", schema), {"id": job_id})
    return [(row["id"], row["state"]) for row in cur.fetchall()]


def dependencies_of(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, job_id: int
) -> JobDependencies:
    """Both directions of ``job_id``'s dependencies."""
    cur.execute(queries.bind("job_dependencies_get", schema), {"id": job_id})
    row = queries.one_row(cur)
    mode = "finished" if row["finished_mode"] else "succeeded"
    return JobDependencies(list(row["depends_on"]), list(row["dependents"]), mode)


def dependencies_of_many(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, job_ids: Sequence[int]
) -> dict[int, tuple[Dependency, ...]]:
    """What each of ``job_ids`` depended on, in the order of its ``depends_on``: one
    statement for them all. A job with no dependencies is left out."""
    cur.execute(queries.bind("job_dependencies_of_many", schema), {"ids": list(job_ids)})
    found: dict[int, list[Dependency]] = {}
    for row in cur.fetchall():
        if row["state"] is None:
            # Pruned. In "succeeded" mode only its success could have released the job.
            state = "pruned" if row["finished_mode"] else JobState.SUCCEEDED.value
            dependency = Dependency(row["id"], None, state, None, pruned=True)
        else:
            dependency = Dependency(row["id"], row["task"], row["state"], row["result"])
        found.setdefault(row["job_id"], []).append(dependency)
    return {job_id: tuple(each) for job_id, each in found.items()}


def _state(value: str | None) -> JobState | None:
    return None if value is None else JobState(value)


def neighbours_of(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, job_id: int, limit: int
) -> JobNeighbours:
    """The first ``limit`` dependencies and dependents of ``job_id``, with their states."""
    cur.execute(queries.bind("job_neighbours_get", schema), {"id": job_id, "limit": limit})
    rows = cur.fetchall()
    linked: dict[str, list[LinkedJob]] = {"depends_on": [], "dependents": []}
    for row in rows:
        if row["direction"] is not None:
            linked[row["direction"]].append(
                LinkedJob(row["id"], row["task"], row["queue"], _state(row["state"]))
            )
    return JobNeighbours(
        linked["depends_on"],
        linked["dependents"],
        rows[0]["depends_on_total"],
        rows[0]["dependents_total"],
    )


def workflow_of(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, job_id: int, limit: int
) -> Workflow:
    """The graph around ``job_id`` (see :class:`Workflow`), in one statement."""
    cur.execute(queries.bind("job_workflow_get", schema), {"id": job_id, "limit": limit})
    jobs = [
        WorkflowJob(
            row["id"],
            row["task"],
            row["queue"],
            _state(row["state"]),
            depends_on=tuple(row["depends_on"]),
            more_dependencies=row["more_dependencies"],
            more_dependents=row["more_dependents"],
        )
        for row in cur.fetchall()
    ]
    return Workflow(job_id, jobs, limit)
