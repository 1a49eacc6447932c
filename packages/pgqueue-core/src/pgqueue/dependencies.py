"""Jobs that wait for other jobs: ``depends_on``.

A job enqueued with ``depends_on=[ids]`` is **waiting** until every one of those jobs
has succeeded, then **queued** like any other, by the transaction that acks the last
of them. A dependency that already succeeded counts as met at once; one that ends
**dead** or **cancelled** cancels its waiting dependents, with a ``last_error`` naming
it (``dependency 12 ended dead``), and theirs in turn. A dependency that fails an
attempt and is retried by its backoff is not finished: its dependents keep waiting.

Retrying a dead dependency (``pgqueue retry``) does not bring back the dependents it
cancelled: they stay cancelled, and may be retried themselves, in which case they run
without waiting. An id that is no job (never was, or pruned) is refused:
:class:`~pgqueue.errors.UnknownDependencies`, and nothing is enqueued.

In a batch (``enqueue_many``, ``POST /jobs/batch``) an item may depend on an earlier
item of the same batch by its position: ``BatchItem(0)`` in Python, ``{"index": 0}``
over HTTP.

How it stays exact under concurrency:

- The enqueue marks each unfinished dependency (``has_dependents``) with a row update,
  in its own transaction, before inserting the job. An ack of that dependency under
  way holds the row: the enqueue waits for it, then finds the dependency finished and
  counts it met. An ack that comes later waits for the enqueue's commit, then reads the
  mark from the row it deletes.
- The ack reads the mark from the rows it deletes and, only when one of them has
  dependents, calls ``dependents_released`` from within its statement. The function's
  own statement takes a new snapshot (so it sees the dependents of an enqueue the ack
  waited for) and counts each waiting dependent's ``pending_dependencies`` down with a
  row update: two acks of a job's last two dependencies take turns on its row, and
  exactly one of them queues it.
- Cancelling dependents goes one level per statement, for the same reason.

An ack whose jobs have no dependents pays nothing for this: no statement, no call.
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
READS = 2
"""How many times the states of dependencies are read when some are found nowhere: one
that finished while the first read waited for its row is found by the second (a new
statement, a new snapshot); an id found nowhere twice is no job."""


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
) -> tuple[list[EnqueueResult], list[IdempotencyMismatch]]:
    """Enqueue ``specs``, some with ``depends_on``, on ``cur`` (a dict-row jsonb cursor)
    in its connection's transaction, in order: the items without dependencies between
    two that have some go in together. Returns what
    :func:`pgqueue.keyed.insert_keyed` returns, for the whole batch."""
    results: list[EnqueueResult] = []
    conflicts: list[IdempotencyMismatch] = []
    for start, group in _groups(specs):
        if has_dependencies(group[0]):
            spec = group[0]
            ids = sorted({_resolve(dependency, results) for dependency in spec.dependencies})
            states = _states(cur, schema, ids, start if len(specs) > 1 else None)
            unmet = [i for i in ids if states[i] != JobState.SUCCEEDED.value]
            failed = [(i, states[i]) for i in ids if states[i] in ("dead", "cancelled")]
            done, mismatches = keyed.insert_keyed(
                cur, schema, [spec], trace_context, pending_dependencies=[len(unmet)]
            )
            result = done[0]
            if result.created:
                cur.execute(
                    queries.bind("job_dependencies_insert", schema),
                    {"depends_on": ids, "job_ids": [result.job.id] * len(ids)},
                )
                if failed:
                    cancelled = cancel_dependents(cur, schema, failed)
                    for job in cancelled:
                        if job.id == result.job.id:
                            result = EnqueueResult(job, created=True)
            results.append(result)
            conflicts += [dataclasses.replace(m, index=start) for m in mismatches]
        else:
            done, mismatches = keyed.insert_keyed(cur, schema, group, trace_context)
            results += done
            conflicts += [dataclasses.replace(m, index=start + m.index) for m in mismatches]
    return results, conflicts


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


def _states(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, ids: list[int], index: int | None
) -> dict[int, str]:
    """Each dependency's state, its row marked as having dependents (see
    ``job_dependencies_lock``). Raises UnknownDependencies for ids that are no job."""
    states: dict[int, str] = {}
    missing = ids
    for _ in range(READS):
        cur.execute(queries.bind("job_dependencies_lock", schema), {"ids": missing})
        states.update((row["id"], row["state"]) for row in cur.fetchall() if row["state"])
        missing = [i for i in ids if i not in states]
        if not missing:
            return states
    raise UnknownDependencies(missing, index=index)


def cancel_dependents(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, failed: Sequence[tuple[int, str]]
) -> list[Job]:
    """Cancel the waiting jobs that depend on ``failed`` ((id, state) of jobs that
    ended dead or cancelled), and theirs in turn, in ``cur``'s transaction: the jobs
    cancelled, nearest first."""
    cancelled: list[Job] = []
    level = list(failed)
    while level:
        cur.execute(
            queries.bind("job_dependents_cancel", schema),
            {"ids": [i for i, _ in level], "states": [s for _, s in level]},
        )
        rows: list[dict[str, Any]] = cur.fetchall()
        jobs = [Job.from_row(row) for row in rows]
        cancelled += jobs
        level = [(row["id"], "cancelled") for row in rows if row["has_dependents"]]
    return cancelled


def dependencies_of(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, job_id: int
) -> JobDependencies:
    """Both directions of ``job_id``'s dependencies."""
    cur.execute(queries.bind("job_dependencies_get", schema), {"id": job_id})
    row = queries.one_row(cur)
    return JobDependencies(list(row["depends_on"]), list(row["dependents"]))
