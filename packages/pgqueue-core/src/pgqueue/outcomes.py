"""The worker protocol's second half, part of :class:`pgqueue.WorkerProtocol`: what became of each
attempt. Successes, failures (with their backoff) and dead-lettering of a batch are
written by one statement, ``job_finish_many``, fenced by each attempt's lease token;
the reaper finishes expired leases through it too. The lifecycle hooks run after the
commit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

import psycopg

from pgqueue import dependencies, effects, jsonb, queries, validation
from pgqueue.backoff import backoff_seconds
from pgqueue.effects import CompletionCheck
from pgqueue.errors import LeaseLost, ValidationError
from pgqueue.job import Job, JobState, Lease
from pgqueue.locks import advisory_key
from pgqueue.queue_base import QueueBase, send_commit
from pgqueue.throttle import Throttle


@dataclass(frozen=True)
class OutcomeBatch:
    """What :meth:`~OutcomeMethods.finish_many` wrote: the jobs that succeeded, the
    failed attempts (errors, and results the database could not store), and the ids
    whose lease was lost."""

    succeeded: list[Job]
    failed: list[Job]
    lost: list[int]
    lost_leases: list[Lease] = field(default_factory=list)
    """The leases lost, for telling apart two outcomes of one job in the same batch."""


class OutcomeMethods(QueueBase):
    """Acks, failures and the reaper: the part of :class:`pgqueue.WorkerProtocol` that
    finishes attempts."""

    def ack(self, job: Job, result: Any = None) -> Job:
        """Mark ``job`` succeeded with ``result``, if its lease is still held.

        A result PostgreSQL cannot store (not JSON, NaN/Infinity, NUL) is recorded as a
        failed attempt instead, and the returned job says so. Raises
        :class:`~pgqueue.errors.LeaseLost` when the lease token no longer matches.
        """
        batch = self.finish_many([(job, result)])
        if batch.lost:
            raise LeaseLost(job.id)
        return (batch.succeeded or batch.failed)[0]

    def ack_many(self, outcomes: Iterable[tuple[Job, Any]]) -> OutcomeBatch:
        """Acknowledge many jobs in one statement: :meth:`finish_many` with no errors."""
        return self.finish_many(outcomes)

    def fail(self, job: Job, error: str | BaseException) -> Job:
        """Record a failed attempt of ``job``: back to queued after a backoff, or dead
        when ``max_attempts`` is used up. Raises LeaseLost if the lease was lost."""
        batch = self.finish_many((), [(job, error)])
        if batch.lost:
            raise LeaseLost(job.id)
        return batch.failed[0]

    def finish_many(
        self,
        successes: Iterable[tuple[Job, Any]],
        failures: Iterable[tuple[Job, str | BaseException]] = (),
    ) -> OutcomeBatch:
        """Write what became of many attempts in one statement, each guarded by its
        lease: each ``(job, result)`` of ``successes`` succeeds; each ``(job, error)``
        of ``failures`` goes back to queued after its backoff
        (:func:`~pgqueue.backoff.backoff_seconds`), or dead once ``max_attempts`` is
        used up. A result that cannot be stored becomes a failed attempt. Outcomes whose
        lease was lost are refused and reported in ``lost``. The dead jobs' waiting
        dependents are cancelled in the same transaction; the hooks run after it
        commits."""
        rows = _outcome_rows(successes, failures, self.max_result_bytes)
        if not rows:
            return OutcomeBatch([], [], [])
        with self._connection() as conn:
            written, cancelled = self._write_outcomes(conn, rows, commit=True)
        return self._settle(rows, written, cancelled)

    def _write_outcomes(
        self, conn: psycopg.Connection, rows: list[_OutcomeRow], *, commit: bool
    ) -> tuple[_Written, list[Job]]:
        """Write ``rows`` (in job id order) in ``conn``'s transaction and, when some job
        ended dead with dependents, cancel those. With ``commit``, a batch of successes
        alone, the common case, is pipelined with its commit in one round trip (a worker
        cut off mid-write then never leaves the rows locked); otherwise the caller
        commits."""
        if commit and not any(row.error is not None for row in rows):
            with conn.pipeline():
                read = self._send_outcomes(conn, rows)
                send_commit(conn)
            return read(), []
        written = self._send_outcomes(conn, rows)()
        ended = [
            (rows[failure.position - 1].job.id, "dead")
            for failure in written.failed
            if failure.has_dependents and failure.state == "dead"
        ]
        if not ended:
            return written, []
        return written, dependencies.cancel_dependents(jsonb.cursor(conn), self.schema, ended)

    def _send_outcomes(
        self, conn: psycopg.Connection, rows: list[_OutcomeRow]
    ) -> Callable[[], _Written]:
        """Send job_finish_many for ``rows`` in ``conn``'s current transaction (and
        pipeline), as one statement per OUTCOME_STATEMENT_MAX_BYTES of results: a batch
        of large results would otherwise make a statement too large for PostgreSQL to
        take (1 GB), refused on every retry. The function returned reads what they
        wrote, as if one statement had written it all, positions counted across them."""
        sent: list[tuple[int, psycopg.Cursor[Any]]] = []
        for offset, chunk in _chunks(rows):
            params = _statement_params(chunk, self.retry_base, self.retry_cap)
            # Failed attempts come back with their error history, which may hold what
            # Python cannot load (written by hand): read through jsonb's loaders, it
            # cannot fail the write. Successes return no jsonb, and skip the loaders'
            # cost.
            cur = conn.cursor() if params["errors"] is None else jsonb.cursor(conn, tuples=True)
            cur.execute(self._sql("job_finish_many"), params)
            sent.append((offset, cur))

        def read() -> _Written:
            written_at: datetime | None = None
            refused: list[int] = []
            failed: list[_Failure] = []
            for offset, cur in sent:
                for row in cur.fetchall():
                    written_at, chunk_refused, _, position, *rest = row
                    if position is not None:
                        failed.append(_Failure(offset + position, *rest))
                refused.extend(offset + position for position in chunk_refused)
            return _Written(cast(datetime, written_at), sorted(set(refused)), failed)

        return read

    def _settle(
        self, rows: list[_OutcomeRow], written: _Written, cancelled: list[Job]
    ) -> OutcomeBatch:
        """Turn what ``job_finish_many`` wrote into an OutcomeBatch, and run the hooks:
        ``on_success``, ``on_fail`` and ``on_dead``, and ``on_cancel`` for the dependents
        cancelled."""
        failed_at = {failure.position: failure for failure in written.failed}
        refused = set(written.refused)
        succeeded: list[Job] = []
        failed: list[tuple[Job, str]] = []
        lost: list[Lease] = []
        # Positions count from 1 in job_finish_many's arrays, which are in this order.
        for position, row in enumerate(rows, start=1):
            job = row.job
            if position in refused:
                lost.append(Lease(job.id, cast(uuid.UUID, job.lease_token)))
            elif row.error is None:
                succeeded.append(job.succeeded(row.result, written.written_at))
            else:
                at = failed_at[position]
                state = JobState(at.state)
                failed.append(
                    (
                        job.failed(state, at.run_at, row.error, at.errors, written.written_at),
                        row.error,
                    )
                )
        self._notify_each("on_success", ({"job": job, "result": job.result} for job in succeeded))
        for job, error in failed:
            dead = job.state is JobState.DEAD
            self._notify("on_fail", job=job, error=error, next_run_at=None if dead else job.run_at)
            if dead:
                self._notify("on_dead", job=job)
        self._notify_each("on_cancel", ({"job": dependent} for dependent in cancelled))
        return OutcomeBatch(
            succeeded=succeeded,
            failed=[job for job, _ in failed],
            lost=[lease.job_id for lease in lost],
            lost_leases=lost,
        )

    def throttle_many(self, throttles: Sequence[tuple[Job, Throttle]]) -> list[int]:
        """Put back each running job of ``throttles`` whose lease is still held, runnable
        after its :class:`~pgqueue.throttle.Throttle`'s seconds, giving its attempt back;
        a ``"partition"`` or ``"queue"`` scope also holds back the job's key or queue
        until then. One statement for all. Returns the ids written: the others' leases
        were lost. Runs no hook: a throttled attempt neither failed nor succeeded."""
        if not throttles:
            return []
        params = {
            "ids": [job.id for job, _ in throttles],
            "tokens": [job.lease_token for job, _ in throttles],
            "delays": [throttle.seconds for _, throttle in throttles],
            "scopes": [throttle.scope for _, throttle in throttles],
        }
        return [row["id"] for row in self._rows("job_throttle_many", params)]

    def check_completions(self, jobs: Sequence[Job]) -> list[CompletionCheck]:
        """What became of the completions each of ``jobs`` made in its handler's
        transaction (``job.complete``, ``job.transaction()``), one statement for all,
        in order: committed (with the job as it left it), still open, or not committed.
        Runs no hook: :meth:`settle_completed` does, once the caller has decided.

        A loop of your own that runs handlers asks this, for each job whose handler
        completed it (:func:`pgqueue.effects.completions` is not empty), instead of
        acking it: a committed one needs nothing more; one not committed is a failed
        attempt; one still open is asked about again later."""
        if not jobs:
            return []
        with self._connection() as conn:
            return effects.check_completions(conn, self.schema, jobs)

    def settle_completed(self, jobs: Iterable[Job]) -> None:
        """Run ``on_success`` for ``jobs``, each completed by its handler in a
        transaction that committed (as :meth:`check_completions` returns them)."""
        self._notify_each("on_success", ({"job": job, "result": job.result} for job in jobs))

    def reap(self, limit: int = 1000) -> list[Job] | None:
        """Return expired leases to queued (with backoff) or dead; one reaper at a time.
        Each expired attempt is finished as a failed one, through the same statement as
        a worker's failures.

        Returns the reaped jobs, or None when another process holds the reaper lock.
        """
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("reaper_try_lock"), {"key": advisory_key("reap", self.schema)})
            if not queries.one_row(cur)["locked"]:
                return None
            cur.execute(self._sql("job_expired_lock"), {"limit": limit})
            expired = [(Job.from_row(row), _expiry(row)) for row in cur.fetchall()]
            rows = _outcome_rows((), expired, self.max_result_bytes)
            if rows:
                written, cancelled = self._write_outcomes(conn, rows, commit=False)
            # And the waiting records and registry rows of workers that stopped
            # without removing them, and the rows of job watchers that did the same.
            cur.execute(self._sql("waiters_expired_delete"))
            cur.execute(self._sql("job_waiters_expired_delete"))
            cur.execute(self._sql("workers_expired_delete"))
            # And the partition keys' controls that hold nothing any more.
            cur.execute(self._sql("partition_controls_prune"), {"limit": limit})
        if not rows:
            return []
        return self._settle(rows, written, cancelled).failed


def _expiry(row: dict[str, Any]) -> str:
    """The error an expired attempt is recorded with: how long it ran, and whose it was;
    first, for a payload Python cannot load, that no handler could have run it (a claim
    fails such an attempt at once, unless it could not write that failure)."""
    ran_for = cast(timedelta | None, row["ran_for"]) or timedelta(0)
    seconds = max(ran_for.total_seconds(), 0.0)
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    expired = (
        f"lease expired after {int(hours):02d}:{int(minutes):02d}:{rest:06.3f} "
        f"(worker {row['worker_id'] or 'unknown'} stopped heartbeating)"
    )
    if isinstance(row["payload"], jsonb.UndecodableJson):
        return f"{undecodable_payload_error(row['payload'])}; {expired}"
    return expired


def undecodable_payload_error(payload: jsonb.UndecodableJson) -> str:
    """The error of an attempt whose payload Python could not load."""
    return f"payload could not be decoded: {payload.reason}"


class _OutcomeRow(NamedTuple):
    """One outcome as job_finish_many is sent it: the job, and its result (with its
    JSON text) or its error."""

    job: Job
    result: Any
    text: str
    error: str | None


def _outcome_rows(
    successes: Iterable[tuple[Job, Any]],
    failures: Iterable[tuple[Job, str | BaseException]],
    max_result_bytes: int,
) -> list[_OutcomeRow]:
    """The outcomes as job_finish_many takes them, in job id order: any two writes that
    meet on the same rows then lock them in the same order (heartbeats never wait for a
    row: see job_heartbeat_many). A result PostgreSQL cannot store, or one over
    ``max_result_bytes`` as JSON text, becomes an error."""
    rows: list[_OutcomeRow] = []
    for job, result in successes:
        if result is None:  # most handlers return nothing: no need to serialise it
            rows.append(_OutcomeRow(job, None, "null", None))
            continue
        try:
            text = validation.jsonb_text("result", result)
            validation.within_limit("result", text, max_result_bytes)
        except ValidationError as exc:
            rows.append(_OutcomeRow(job, None, "null", f"result could not be stored: {exc}"))
        else:
            rows.append(_OutcomeRow(job, result, text, None))
    rows.extend(_OutcomeRow(job, None, "null", _error_text(error)) for job, error in failures)
    rows.sort(key=lambda row: row.job.id)
    return rows


class _Written(NamedTuple):
    """What job_finish_many's rows said, over every statement of a batch."""

    written_at: datetime
    refused: list[int]
    """Positions (from 1) of the outcomes whose lease was no longer held."""
    failed: list[_Failure]


class _Failure(NamedTuple):
    """A failed attempt job_finish_many wrote: its position (from 1), and what it left."""

    position: int
    state: str
    run_at: datetime
    errors: list[dict[str, Any]]
    has_dependents: bool


OUTCOME_STATEMENT_MAX_BYTES = 16 * 1024 * 1024
"""Results sent in one job_finish_many statement, at most (a single larger result goes
alone): far under PostgreSQL's 1 GB message limit, and quick to send and parse."""


def _chunks(ordered: list[_OutcomeRow]) -> Iterator[tuple[int, list[_OutcomeRow]]]:
    """``ordered`` in runs of at most OUTCOME_STATEMENT_MAX_BYTES of result text, each
    with the number of outcomes before it (for positions across statements)."""
    start = 0
    size = 0
    for index, outcome in enumerate(ordered):
        # Characters, not bytes: counting bytes would encode every result once more.
        # A run may so hold up to four times the bound, still far under 1 GB.
        length = len(outcome.text)
        if index > start and size + length > OUTCOME_STATEMENT_MAX_BYTES:
            yield start, ordered[start:index]
            start, size = index, 0
        size += length
    yield start, ordered[start:]


def _statement_params(
    ordered: Sequence[_OutcomeRow], retry_base: float, retry_cap: float
) -> dict[str, Any]:
    # Array literals and JSON arrays, as job_finish_many expects: ids and UUIDs need no
    # quoting, and each result is already valid JSON text. Tokens go as their 32 hex
    # digits, which PostgreSQL reads as a uuid too: formatting the integer costs a
    # fraction of str(UUID), which inserts the hyphens in Python code.
    params: dict[str, Any] = {
        "ids": "{" + ",".join([str(row.job.id) for row in ordered]) + "}",
        # Every outcome is of a claimed job, which holds a lease token.
        "tokens": "{"
        + ",".join([f"{cast(uuid.UUID, row.job.lease_token).int:032x}" for row in ordered])
        + "}",
        "results": "[" + ",".join([row.text for row in ordered]) + "]",
        "errors": None,
        "delays": None,
    }
    if any(row.error is not None for row in ordered):
        # The backoff of each failed attempt, worked out here and nowhere else.
        params["errors"] = json.dumps([row.error for row in ordered])
        params["delays"] = (
            "{"
            + ",".join(
                "NULL"
                if row.error is None
                else repr(backoff_seconds(row.job.attempts, retry_base, retry_cap))
                for row in ordered
            )
            + "}"
        )
    return params


def _error_text(error: str | BaseException) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    # PostgreSQL text cannot hold NUL, nor UTF-8 a lone surrogate, and an error message
    # must never fail to store.
    text = text.replace("\x00", "\\0")[:10_000]
    return text.encode("utf-8", "replace").decode("utf-8")
