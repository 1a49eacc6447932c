"""Enqueueing jobs that carry a key: an idempotency key, a unique key, or both.

The two keys answer different questions:

- An **idempotency key** says "this request, at most once". It is held from the
  enqueue until the job is pruned, wherever the job is (queued, running or finished),
  and a repeat returns the job holding it only if task, queue and payload match
  (:class:`~pgqueue.errors.IdempotencyConflict` otherwise).
- A **unique key** says "at most one such job pending". It is held only while its job
  is queued or running: once the job has succeeded, died or been cancelled, the key is
  free again. A repeat returns whatever job holds it, with ``created=False``, and is
  **not** compared with it: another payload or task under the same unique key still
  gets the holder. The database enforces it (a partial unique index on active_jobs), so
  any number of concurrent producers create one job.

With both on one enqueue, the idempotency key is checked first: a key already held
returns its job (even if that job has finished, and whatever now holds the unique key).
Otherwise the unique key decides: if another job holds it, that job is returned and the
idempotency key is not recorded, since it stays only with a job its enqueue created (a
later repeat of that request may then create a job, once the unique key is free).

Everything happens in one transaction, the caller's or a pooled connection's: the
insert (``job_insert_many_keyed``), the release of idempotency keys taken for items
that a unique key turned away, and the lookups of the jobs that hold the keys. A key
whose holder finished (or was pruned) between the insert and the lookup is free again,
so its item is inserted anew in another round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from pgqueue import queries
from pgqueue.errors import DatabaseUnavailable, IdempotencyMismatch
from pgqueue.job import EnqueueResult, Job

if TYPE_CHECKING:
    from pgqueue.job_spec import JobSpec

ROUNDS = 10
"""How many times an item is tried whose key's holder vanished before it was read: a
holder finishing exactly then is rare, ten times in a row is a server in trouble."""


def is_keyed(spec: JobSpec) -> bool:
    """True for a spec that must take the keyed path (and never COPY)."""
    return spec.idempotency_key is not None or spec.unique_key is not None


def insert_keyed(
    cur: psycopg.Cursor[dict[str, Any]],
    schema: str,
    specs: Sequence[JobSpec],
    trace_context: str | None,
    *,
    pending_dependencies: Sequence[int | None] | None = None,
) -> tuple[list[EnqueueResult], list[IdempotencyMismatch]]:
    """Enqueue ``specs`` (some with keys) on ``cur``, a dict-row jsonb cursor (see
    :func:`pgqueue.jsonb.cursor`), in its connection's transaction, which must not be in
    autocommit mode. Returns the result of each spec, in input order, and the specs
    whose idempotency key belongs to a job with another task, queue or payload (the
    caller decides what to do with what this call created, see ``Queue.enqueue_many``).

    ``pending_dependencies`` gives, per spec, how many of its dependencies have not
    succeeded: a spec with any is inserted waiting (see :mod:`pgqueue.dependencies`).
    """
    waits = list(pending_dependencies or [None] * len(specs))
    results: list[EnqueueResult | None] = [None] * len(specs)
    conflicts: list[IdempotencyMismatch] = []
    pending = list(range(len(specs)))
    for _ in range(ROUNDS):
        by_idempotency: list[int] = []
        by_unique: list[int] = []
        released: list[tuple[str, int]] = []
        rows = _insert(
            cur, schema, [specs[i] for i in pending], [waits[i] for i in pending], trace_context
        )
        for row in rows:
            index = pending[row["position"] - 1]
            spec = specs[index]
            if row["id"] is not None:
                results[index] = EnqueueResult(Job.from_row(row), created=True)
            elif spec.idempotency_key is not None and not row["took_key"]:
                by_idempotency.append(index)
            else:
                # Turned away by its unique key: the idempotency key it took, if any, is
                # given back before anything reads it.
                by_unique.append(index)
                if row["took_key"]:
                    key = spec.idempotency_key
                    released.append((key, row["reserved_id"]))
        if released:
            cur.execute(
                queries.bind("idempotency_keys_release", schema),
                {"keys": [key for key, _ in released], "ids": [i for _, i in released]},
            )
        for index, (job, differs) in _idempotency_holders(cur, schema, specs, by_idempotency):
            results[index] = EnqueueResult(job, created=False)
            if differs:
                mismatch = (index, specs[index].idempotency_key, job.id, tuple(differs))
                conflicts.append(IdempotencyMismatch(*mismatch))  # type: ignore[arg-type]
        for index, job in _unique_holders(cur, schema, specs, by_unique):
            results[index] = EnqueueResult(job, created=False)
        pending = [index for index in pending if results[index] is None]
        if not pending:
            return results, conflicts  # type: ignore[return-value]
    raise DatabaseUnavailable("an enqueue's key kept being freed before its holder was read")


def _insert(
    cur: psycopg.Cursor[dict[str, Any]],
    schema: str,
    specs: list[JobSpec],
    waits: list[int | None],
    trace_context: str | None,
) -> list[dict[str, Any]]:
    """job_insert_many_keyed for ``specs``: one row per spec, in order."""
    rows = []
    for spec, wait in zip(specs, waits, strict=True):
        row = spec.params()
        row["unique_key"] = spec.unique_key
        row["pending_dependencies"] = wait
        if trace_context is not None:
            row["trace_context"] = trace_context
        rows.append(row)
    columns = {key: [row[key] for row in rows] for key in rows[0]}
    cur.execute(queries.bind("job_insert_many_keyed", schema), columns)
    return cur.fetchall()


def _idempotency_holders(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, specs: Sequence[JobSpec], indexes: list[int]
) -> list[tuple[int, tuple[Job, list[str]]]]:
    """For the specs at ``indexes``, the job holding each one's idempotency key and which
    of task, queue and payload differ from the spec's. A key whose row was committed by
    a concurrent producer after the insert's snapshot is found: each statement takes a
    new snapshot (READ COMMITTED). A key found nowhere (pruned in between, or released
    by an earlier item of this call) leaves its spec for the next round."""
    if not indexes:
        return []
    params = [specs[i].params() for i in indexes]
    cur.execute(
        queries.bind("job_get_many_by_idempotency_key", schema),
        {
            "idempotency_keys": [p["idempotency_key"] for p in params],
            "tasks": [p["task"] for p in params],
            "queues": [p["queue"] for p in params],
            "payloads": [p["payload"] for p in params],
        },
    )
    return [
        (indexes[row["position"] - 1], (Job.from_row(row), row["differs"]))
        for row in cur.fetchall()
    ]


def _unique_holders(
    cur: psycopg.Cursor[dict[str, Any]], schema: str, specs: Sequence[JobSpec], indexes: list[int]
) -> list[tuple[int, Job]]:
    """For the specs at ``indexes``, the queued or running job holding each one's unique
    key (not compared with the spec). A key whose holder finished since the insert is
    free again: its spec is left for the next round."""
    if not indexes:
        return []
    keys = sorted({specs[i].unique_key for i in indexes})  # type: ignore[type-var]
    cur.execute(queries.bind("job_get_many_by_unique_key", schema), {"unique_keys": keys})
    holders = {row["unique_key"]: Job.from_row(row) for row in cur.fetchall()}
    return [(i, holders[specs[i].unique_key]) for i in indexes if specs[i].unique_key in holders]
