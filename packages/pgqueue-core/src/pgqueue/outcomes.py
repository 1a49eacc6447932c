"""The worker protocol's second half, part of :class:`pgqueue.Queue`: what became of each
attempt (acks in one statement per batch, failed attempts with their backoff, the
reaper's expired leases), fenced by the lease token, and the hooks run after they
commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, cast

import psycopg
import psycopg.errors

from pgqueue import dependencies, jsonb, queries, validation
from pgqueue.backoff import backoff_seconds
from pgqueue.errors import LeaseLost, ValidationError
from pgqueue.job import Job, JobState, Lease
from pgqueue.locks import advisory_key
from pgqueue.queue_base import QueueBase, send_commit


@dataclass(frozen=True)
class AckBatch:
    """What ``ack_many`` wrote: succeeded jobs, jobs whose result could not be stored
    (recorded as failed attempts instead), and the ids whose lease was lost."""

    succeeded: list[Job]
    failed: list[Job]
    lost: list[int]
    lost_leases: list[Lease] = field(default_factory=list)
    """The leases lost, for telling apart two outcomes of one job in the same batch."""


class OutcomeMethods(QueueBase):
    """Acks, failures and the reaper: the part of :class:`pgqueue.Queue` that finishes
    attempts."""

    def ack(self, job: Job, result: Any = None) -> Job:
        """Mark ``job`` succeeded with ``result``, if its lease is still held.

        A result PostgreSQL cannot store (not JSON, NaN/Infinity, NUL) is recorded as a
        failed attempt instead, and the returned job says so. Raises
        :class:`~pgqueue.errors.LeaseLost` when the lease token no longer matches.
        """
        batch = self.ack_many([(job, result)])
        if batch.lost:
            raise LeaseLost(job.id)
        return (batch.succeeded or batch.failed)[0]

    def ack_many(self, outcomes: Iterable[tuple[Job, Any]]) -> AckBatch:
        """Acknowledge many jobs in one statement (results that cannot be stored become
        failed attempts, each its own statement)."""
        storable, unstorable = _split_storable(outcomes, self.max_result_bytes)
        written: _AckWritten | None = None
        if storable:
            with self._connection() as conn:
                # As in claim: a worker cut off mid-ack never leaves the rows locked.
                with conn.pipeline():
                    read_acks = self._send_acks(conn, storable)
                    send_commit(conn)
                written = read_acks()
        return self._settle_acks(storable, written, unstorable)

    def _send_acks(
        self, conn: psycopg.Connection, storable: list[_Storable]
    ) -> Callable[[], _AckWritten]:
        """Send job_ack_many for ``storable`` in ``conn``'s current transaction (and
        pipeline), as one statement per ACK_STATEMENT_MAX_BYTES of results: a batch of
        large results would otherwise make a statement too large for PostgreSQL to take
        (1 GB), refused on every retry. The function returned reads what they wrote, as
        if one statement had written it all."""
        sent: list[tuple[int, psycopg.Cursor]] = []
        for offset, chunk in _ack_chunks(storable):
            cur = conn.cursor()
            cur.execute(self._sql("job_ack_many"), _ack_params(chunk))
            sent.append((offset, cur))

        def read() -> _AckWritten:
            finished_at = None
            refused: list[int] = []
            for offset, cur in sent:
                written = _AckWritten(*cur.fetchone()[:2])  # type: ignore[index]
                finished_at = finished_at or written.finished_at
                refused.extend(offset + position for position in written.refused)
            return _AckWritten(finished_at, refused)  # type: ignore[arg-type]

        return read

    def _settle_acks(
        self,
        storable: list[_Storable],
        written: _AckWritten | None,
        unstorable: list[tuple[Job, str]],
    ) -> AckBatch:
        """Turn what ``job_ack_many`` wrote into an AckBatch, record the unstorable
        results as failed attempts, and run ``on_success`` for what was acked."""
        succeeded: list[Job] = []
        lost: list[Lease] = []
        if written is not None:
            # Positions count from 1 in job_ack_many's arrays, which are in this order.
            refused = set(written.refused)
            for position, outcome in enumerate(storable, start=1):
                job = outcome.job
                if position in refused:
                    lost.append(Lease(job.id, job.lease_token))  # type: ignore[arg-type]
                else:
                    succeeded.append(job.succeeded(outcome.result, written.finished_at))
        failed: list[Job] = []
        for job, error in unstorable:
            try:
                failed.append(self.fail(job, error))
            except LeaseLost:
                lost.append(Lease(job.id, job.lease_token))  # type: ignore[arg-type]
        self._notify_each("on_success", ({"job": job, "result": job.result} for job in succeeded))
        return AckBatch(
            succeeded=succeeded,
            failed=failed,
            lost=[lease.job_id for lease in lost],
            lost_leases=lost,
        )

    def fail(self, job: Job, error: str | BaseException) -> Job:
        """Record a failed attempt of ``job``: back to queued after a backoff, or dead
        when ``max_attempts`` is used up. Raises LeaseLost if the lease was lost."""
        message = _error_text(error)
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(
                self._sql("job_fail"),
                {
                    "id": job.id,
                    "token": job.lease_token,
                    "error": message,
                    "retry_delay": backoff_seconds(job.attempts, self.retry_base, self.retry_cap),
                },
            )
            rows = cur.fetchall()
            if not rows:
                raise LeaseLost(job.id)
            cancelled = self._cancel_dependents(cur, rows)
        failed = Job.from_row(rows[0])
        self._notify_failed(failed, message)
        self._notify_each("on_cancel", ({"job": dependent} for dependent in cancelled))
        return failed

    def _cancel_dependents(
        self, cur: psycopg.Cursor[dict[str, Any]], rows: Iterable[Mapping[str, Any]]
    ) -> list[Job]:
        """In ``cur``'s transaction, cancel the waiting dependents of the jobs in
        ``rows`` that ended dead or cancelled and have dependents."""
        ended = [
            (row["id"], str(row["state"]))
            for row in rows
            if row["has_dependents"] and row["state"] in ("dead", "cancelled")
        ]
        return dependencies.cancel_dependents(cur, self.schema, ended) if ended else []

    def _notify_failed(self, job: Job, message: str) -> None:
        dead = job.state is JobState.DEAD
        self._notify("on_fail", job=job, error=message, next_run_at=None if dead else job.run_at)
        if dead:
            self._notify("on_dead", job=job)

    def reap(self, limit: int = 1000) -> list[Job] | None:
        """Return expired leases to queued (with backoff) or dead; one reaper at a time.

        Returns the reaped jobs, or None when another process holds the reaper lock.
        """
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("reaper_try_lock"), {"key": advisory_key("reap", self.schema)})
            if not queries.one_row(cur)["locked"]:
                return None
            cur.execute(
                self._sql("job_reap"),
                {"limit": limit, "base": self.retry_base, "cap": self.retry_cap},
            )
            rows = cur.fetchall()
            reaped = [Job.from_row(row) for row in rows]
            cancelled = self._cancel_dependents(cur, rows)
            # And the waiting records and registry rows of workers that stopped
            # without removing them.
            cur.execute(self._sql("waiters_expired_delete"))
            cur.execute(self._sql("workers_expired_delete"))
        for job in reaped:
            self._notify_failed(job, job.last_error or "lease expired")
        self._notify_each("on_cancel", ({"job": dependent} for dependent in cancelled))
        return reaped


class _Storable(NamedTuple):
    """An outcome PostgreSQL can store: the job, the handler's result, and its JSON text."""

    job: Job
    result: Any
    text: str


def _split_storable(
    outcomes: Iterable[tuple[Job, Any]], max_result_bytes: int
) -> tuple[list[_Storable], list[tuple[Job, str]]]:
    """Outcomes whose result PostgreSQL can store, and (job, error) for those it cannot
    or that are over ``max_result_bytes`` as JSON text.

    The storable ones come in job id order, the order job_ack_many is given them: any
    two acks that meet on the same rows then lock them in the same order (heartbeats
    never wait for a row: see job_heartbeat_many)."""
    storable: list[_Storable] = []
    unstorable: list[tuple[Job, str]] = []
    for job, result in outcomes:
        if result is None:  # most handlers return nothing: no need to serialise it
            storable.append(_Storable(job, None, "null"))
            continue
        try:
            text = validation.jsonb_text("result", result)
            validation.within_limit("result", text, max_result_bytes)
        except ValidationError as exc:
            unstorable.append((job, f"result could not be stored: {exc}"))
        else:
            storable.append(_Storable(job, result, text))
    storable.sort(key=lambda s: s.job.id)
    return storable, unstorable


class _AckWritten(NamedTuple):
    """The row job_ack_many returns."""

    finished_at: datetime
    refused: list[int]
    """Positions (from 1) of the outcomes whose lease was no longer held."""


ACK_STATEMENT_MAX_BYTES = 16 * 1024 * 1024
"""Results sent in one job_ack_many statement, at most (a single larger result goes
alone): far under PostgreSQL's 1 GB message limit, and quick to send and parse."""


def _ack_chunks(ordered: list[_Storable]) -> Iterator[tuple[int, list[_Storable]]]:
    """``ordered`` in runs of at most ACK_STATEMENT_MAX_BYTES of result text, each with
    the number of outcomes before it (for positions across statements)."""
    start = 0
    size = 0
    for index, outcome in enumerate(ordered):
        # Characters, not bytes: counting bytes would encode every result once more.
        # A run may so hold up to four times the bound, still far under 1 GB.
        length = len(outcome.text)
        if index > start and size + length > ACK_STATEMENT_MAX_BYTES:
            yield start, ordered[start:index]
            start, size = index, 0
        size += length
    yield start, ordered[start:]


def _ack_params(ordered: list[_Storable]) -> dict[str, Any]:
    # Array literals and one JSON array, as job_ack_many expects: ids and UUIDs need no
    # quoting, and each result is already valid JSON text. Tokens go as their 32 hex
    # digits, which PostgreSQL reads as a uuid too: formatting the integer costs a
    # fraction of str(UUID), which inserts the hyphens in Python code.
    return {
        "ids": "{" + ",".join([str(s.job.id) for s in ordered]) + "}",
        # Every outcome is of a claimed job, which holds a lease token.
        "tokens": "{"
        + ",".join([f"{cast(uuid.UUID, s.job.lease_token).int:032x}" for s in ordered])
        + "}",
        "results": "[" + ",".join([s.text for s in ordered]) + "]",
    }


def _error_text(error: str | BaseException) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    # PostgreSQL text cannot hold NUL, and an error message must never fail to store.
    return text.replace("\x00", "\\0")[:10_000]
