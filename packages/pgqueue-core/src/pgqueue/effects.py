"""Effectively-once side effects: a handler's database writes and its job's completion
commit together, fenced by the attempt's lease.

Delivery is at least once: a worker that stalls past its lease has its job reaped and
run again by another, and the stale attempt's ack is refused by its lease token. What
the stale attempt wrote to the application's own tables is not, unless those writes
are in the transaction that completes the job. :meth:`Job.complete` runs the worker's
own outcome statement (``job_finish_many``, fenced by the lease token: counters,
histograms and dependents exactly as an ack) in the caller's transaction, on the
caller's connection; when the lease is no longer this attempt's, PostgreSQL itself
fails that transaction (``lease_lost_raise``), so nothing of it can commit, however
the caller handles the :class:`~pgqueue.LeaseLost` raised from that error.
:meth:`Job.fence` holds the running job in the caller's transaction instead, for
writes whose completion comes later: the reaper passes it by and a cancel waits until
that transaction ends, while the heartbeat goes on extending the lease.
:meth:`Job.effect_key` names an outbound call (an HTTP ``Idempotency-Key``) the same
way on every attempt of the job, for effects outside the database.

A completion's transaction commits or not out of sight of the worker: the worker asks
the database (:func:`check_completions`, after the handler returned). Each completion
records the transaction that made it and the (sub)transaction that wrote the job's
finished row; the row is there for anyone to see only once both committed, and
``pg_xact_status`` tells a transaction still open from one rolled back. The worker
then writes nothing more for a completed job (its ``on_success`` runs once, with the
stored result), and fails the attempt of one whose completion did not commit.
"""

from __future__ import annotations

import enum
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from pgqueue import queries, validation
from pgqueue.errors import LeaseLost, NotAnAttempt, ValidationError

if TYPE_CHECKING:
    from pgqueue.job import Job

LEASE_LOST_SQLSTATE = "PQ001"
"""The SQLSTATE of the error that fails a transaction whose job.complete or job.fence
found the lease gone: the ``__cause__`` of the :class:`~pgqueue.LeaseLost` raised, a
``psycopg.Error`` whose ``sqlstate`` is this."""

NOT_COMMITTED = (
    "job.complete() was called, but the transaction it was called in did not commit "
    "(it was rolled back, or the savepoint it was called in was); the attempt is retried"
)
"""The error of an attempt whose handler returned after completing the job in a
transaction that did not commit."""

LEASE_LOST_IN_TRANSACTION = (
    "the transaction it was called in has failed and cannot commit: roll it back"
)

OWNER = "_attempt_owner"
"""Key, in a claimed Job's ``__dict__``, of the :class:`AttemptOwner` that claimed it
(set by the claim, shared by every job of it: nothing is allocated per job)."""
_COMPLETIONS = "_completions"
_RESULT = "_result_set"
# A name space of pgqueue's own for effect keys (uuid5 over the job and the name).
_EFFECT_KEYS = uuid.UUID("5b0f2d52-8a43-4c36-9f43-4f1e4c1f7a11")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Guards the making of a job's list of completions (handlers may complete from threads
# of their own).
_completions_lock = threading.Lock()


class ConnectionLender(Protocol):
    """What lends ``Job.transaction`` and ``Job.atransaction`` their connection: a
    worker's pool of connections for handlers, in autocommit mode (the transaction is
    opened on them)."""

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection for the length of the ``with`` block."""
        ...

    def aconnection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """An asyncio connection for the length of the ``async with`` block, on the
        running event loop."""
        ...


class AttemptOwner(Protocol):
    """Who claimed an attempt (a :class:`~pgqueue.WorkerProtocol`): its schema, its
    result size limit, and the lender of handler connections, if any."""

    schema: str
    max_result_bytes: int
    lender: ConnectionLender | None


@dataclass(frozen=True)
class Completion:
    """One call of ``job.complete`` that the database accepted: its result, and what
    tells whether it committed."""

    result: Any
    xact: str
    """The top-level transaction it was made in (``pg_current_xact_id()``)."""
    row_xmin: str | None
    """The (sub)transaction that wrote the job's finished row."""


class CompletionState(enum.StrEnum):
    """What became of a job's completions, as the database tells after the handler."""

    COMMITTED = "committed"
    """One of them committed: the job succeeded with its result."""
    OPEN = "open"
    """None committed, and the transaction of one is still open."""
    NOT_COMMITTED = "not committed"
    """None committed, and none can any more: each was rolled back."""


@dataclass(frozen=True)
class CompletionCheck:
    """What :func:`check_completions` found for one job."""

    state: CompletionState
    job: Job | None = None
    """When committed: the job as its completion left it (succeeded, with the result
    given to ``complete`` and the time it finished)."""


# -- what the handler calls -----------------------------------------------------------


def owner_of(job: Job, method: str) -> AttemptOwner:
    """The owner of ``job``'s attempt, or :class:`~pgqueue.errors.NotAnAttempt`."""
    owner: AttemptOwner | None = job.__dict__.get(OWNER)
    if owner is None or job.lease_token is None:
        raise NotAnAttempt(
            job.id,
            method,
            "it is not a running attempt handed out by a claim (a worker, "
            "WorkerProtocol.claim, or pytest-pgqueue's pgqueue_claim): only those hold "
            "the lease it needs",
        )
    return owner


def complete(job: Job, conn: psycopg.Connection[Any], result: Any = None) -> None:
    """See :meth:`pgqueue.Job.complete`."""
    owner = owner_of(job, "complete")
    params = _finish_params(job, _result_text(owner, result))
    finish = conn.cursor(row_factory=tuple_row)
    evidence = conn.cursor(row_factory=tuple_row)
    # One round trip: the outcome statement, then what tells later whether it committed.
    with conn.pipeline():
        finish.execute(queries.bind("job_finish_many", owner.schema), params)
        evidence.execute(queries.bind("job_completion_evidence", owner.schema), {"id": job.id})
    if _refused(finish.fetchall()):
        _fail_transaction(conn, job, owner, "complete")
    _record(job, result, evidence.fetchone())


async def complete_async(job: Job, conn: psycopg.AsyncConnection[Any], result: Any = None) -> None:
    """:func:`complete` on an asyncio connection."""
    owner = owner_of(job, "complete")
    params = _finish_params(job, _result_text(owner, result))
    finish = conn.cursor(row_factory=tuple_row)
    evidence = conn.cursor(row_factory=tuple_row)
    async with conn.pipeline():
        await finish.execute(queries.bind("job_finish_many", owner.schema), params)
        await evidence.execute(
            queries.bind("job_completion_evidence", owner.schema), {"id": job.id}
        )
    if _refused(await finish.fetchall()):
        await _fail_transaction_async(conn, job, owner, "complete")
    _record(job, result, await evidence.fetchone())


def fence(job: Job, conn: psycopg.Connection[Any]) -> None:
    """See :meth:`pgqueue.Job.fence`."""
    owner = owner_of(job, "fence")
    _check_fence_connection(job, conn.autocommit, conn.info.transaction_status)
    cur = conn.cursor(row_factory=tuple_row)
    cur.execute(queries.bind("job_fence", owner.schema), _lease_params(job))
    if cur.fetchone() is None:
        _fail_transaction(conn, job, owner, "fence")


async def fence_async(job: Job, conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`fence` on an asyncio connection."""
    owner = owner_of(job, "fence")
    _check_fence_connection(job, conn.autocommit, conn.info.transaction_status)
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(queries.bind("job_fence", owner.schema), _lease_params(job))
    if await cur.fetchone() is None:
        await _fail_transaction_async(conn, job, owner, "fence")


def effect_key(job: Job, name: str) -> str:
    """See :meth:`pgqueue.Job.effect_key`."""
    owner = owner_of(job, "effect_key")
    if not isinstance(name, str) or not name:
        raise ValidationError("name", "must be a non-empty string naming the effect")
    # The enqueue time as an exact count of microseconds: its text would depend on the
    # session's time zone, which two workers need not share.
    enqueued = (job.enqueued_at - _EPOCH) // timedelta(microseconds=1)
    identity = "\x1f".join((owner.schema, str(job.id), str(enqueued), name))
    return str(uuid.uuid5(_EFFECT_KEYS, identity))


def set_result(job: Job, value: Any) -> None:
    """See :meth:`pgqueue.Job.set_result`."""
    owner = owner_of(job, "set_result")
    _result_text(owner, value)
    job.__dict__[_RESULT] = value


@contextmanager
def transaction(job: Job) -> Iterator[psycopg.Connection[Any]]:
    """See :meth:`pgqueue.Job.transaction`."""
    lender = _lender(job, "transaction")
    with lender.connection() as conn, conn.transaction():
        before = len(completions(job))
        yield conn
        # Unless the block completed the job itself.
        if len(completions(job)) == before:
            complete(job, conn, job.__dict__.get(_RESULT))


@asynccontextmanager
async def atransaction(job: Job) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """See :meth:`pgqueue.Job.atransaction`."""
    lender = _lender(job, "atransaction")
    async with lender.aconnection() as conn, conn.transaction():
        before = len(completions(job))
        yield conn
        if len(completions(job)) == before:
            await complete_async(job, conn, job.__dict__.get(_RESULT))


def completions(job: Job) -> list[Completion]:
    """The completions of ``job`` the database accepted in this process, oldest first
    (each in a transaction that may or may not have committed)."""
    found: list[Completion] | None = job.__dict__.get(_COMPLETIONS)
    return list(found) if found else []


# -- what the worker asks afterwards --------------------------------------------------


def check_completions(
    conn: psycopg.Connection[Any], schema: str, jobs: Sequence[Job]
) -> list[CompletionCheck]:
    """What became of the completions of each of ``jobs`` (each with at least one, see
    :func:`completions`), in one statement on ``conn``, in order."""
    entries: list[tuple[int, Completion]] = [
        (index, completion) for index, job in enumerate(jobs) for completion in completions(job)
    ]
    cur = conn.cursor(row_factory=tuple_row)
    cur.execute(
        queries.bind("job_completions_check", schema),
        {
            "ids": [jobs[index].id for index, _ in entries],
            "xacts": [completion.xact for _, completion in entries],
            "row_xmins": [completion.row_xmin for _, completion in entries],
        },
    )
    committed: dict[int, CompletionCheck] = {}
    still_open = set()
    for position, status, found, finished_at in cur.fetchall():
        index, completion = entries[position - 1]
        if index in committed:
            continue
        # Only the finished row proves a commit (see job_completions_check). A row
        # moved since (a day partition made late takes the day's jobs from the DEFAULT
        # partition) is taken for none: the attempt's failure is then refused, its
        # lease gone, and logged as lost; never a second success.
        if found:
            job = jobs[index].succeeded(completion.result, finished_at or datetime.now(UTC))
            committed[index] = CompletionCheck(CompletionState.COMMITTED, job)
        elif status == "in progress":
            still_open.add(index)
    checks = []
    for index in range(len(jobs)):
        if index in committed:
            checks.append(committed[index])
        elif index in still_open:
            checks.append(CompletionCheck(CompletionState.OPEN))
        else:
            checks.append(CompletionCheck(CompletionState.NOT_COMMITTED))
    return checks


# -- the parts ------------------------------------------------------------------------


def _result_text(owner: AttemptOwner, result: Any) -> str:
    """``result`` as the JSON text the outcome statement stores, or ValidationError:
    refused here, before anything is sent, so that the caller's transaction is intact."""
    if result is None:
        return "null"
    text = validation.jsonb_text("result", result)
    return validation.within_limit("result", text, owner.max_result_bytes)


def _finish_params(job: Job, text: str) -> dict[str, Any]:
    """job_finish_many's parameters for the success of this one attempt."""
    token = job.lease_token
    assert token is not None  # owner_of checked it
    return {
        "ids": f"{{{job.id}}}",
        "tokens": f"{{{token}}}",
        "results": f"[{text}]",
        "errors": None,
        "delays": None,
    }


def _lease_params(job: Job) -> dict[str, Any]:
    return {"id": job.id, "token": job.lease_token}


def _refused(rows: list[tuple[Any, ...]]) -> bool:
    """Whether job_finish_many refused the one outcome it was sent (its lease lost)."""
    return bool(rows and rows[0][1])


def _record(job: Job, result: Any, evidence: tuple[Any, ...] | None) -> None:
    # job_completion_evidence always returns its one row.
    assert evidence is not None
    xact, row_xmin = evidence
    with _completions_lock:
        job.__dict__.setdefault(_COMPLETIONS, []).append(Completion(result, xact, row_xmin))


def _lease_lost_statement(job: Job, owner: AttemptOwner, method: str) -> sql.Composed:
    message = (
        f"pgqueue: job {job.id} (schema {owner.schema}): job.{method}() found the lease of "
        "this attempt lost (reaped, cancelled or claimed again); this transaction cannot "
        "commit"
    )
    return queries.compose("lease_lost_raise", owner.schema, message=sql.Literal(message))


def _fail_transaction(
    conn: psycopg.Connection[Any], job: Job, owner: AttemptOwner, method: str
) -> None:
    """Fail ``conn``'s transaction by an error of PostgreSQL's own, and raise LeaseLost
    from it."""
    try:
        conn.execute(_lease_lost_statement(job, owner, method))
    except psycopg.Error as exc:
        raise LeaseLost(job.id, LEASE_LOST_IN_TRANSACTION) from exc
    raise LeaseLost(job.id, LEASE_LOST_IN_TRANSACTION)


async def _fail_transaction_async(
    conn: psycopg.AsyncConnection[Any], job: Job, owner: AttemptOwner, method: str
) -> None:
    try:
        await conn.execute(_lease_lost_statement(job, owner, method))
    except psycopg.Error as exc:
        raise LeaseLost(job.id, LEASE_LOST_IN_TRANSACTION) from exc
    raise LeaseLost(job.id, LEASE_LOST_IN_TRANSACTION)


def _check_fence_connection(
    job: Job, autocommit: bool, status: psycopg.pq.TransactionStatus
) -> None:
    """A fence in autocommit mode outside a transaction block would hold the job for
    the length of its own statement: nothing."""
    if autocommit and status == psycopg.pq.TransactionStatus.IDLE:
        raise ValidationError(
            "conn",
            f"job.fence() on job {job.id} holds the job until the caller's transaction "
            "ends, and this connection is in autocommit mode outside a transaction: open "
            "one first (with conn.transaction(): ...)",
        )


def _lender(job: Job, method: str) -> ConnectionLender:
    lender = owner_of(job, method).lender
    if lender is None:
        raise NotAnAttempt(
            job.id,
            method,
            "whoever claimed it lends no connections (a worker does): complete it in a "
            "transaction of your own with job.complete(conn)",
        )
    return lender
