"""The worker protocol's first half, part of :class:`pgqueue.WorkerProtocol`: claiming jobs under
a lease, heartbeats that extend leases, and the LISTEN wake-ups and waiter records that
tell a worker when to claim again. Outcomes are in :mod:`pgqueue.outcomes`.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
import psycopg.errors

from pgqueue import dependencies, effects, jsonb, queries, validation
from pgqueue.effects import AttemptOwner, ConnectionLender
from pgqueue.errors import ValidationError, error_line
from pgqueue.job import Job, JobState, Lease
from pgqueue.outcomes import OutcomeBatch, undecodable_payload_error
from pgqueue.queue_base import QueueBase, send_commit
from pgqueue.registry import NO_WORKER, WorkerRegistration
from pgqueue.settings import DEFAULT_LEASE_SECONDS

CLAIM_MODES = tuple(queries.CLAIM_LOCKS)

log = logging.getLogger("pgqueue.claims")
_HAS_DEPENDENCIES = "_has_dependencies"
"""Set in a claimed job's dict (not a field) until its dependencies are read."""


class Waiter(NamedTuple):
    """A worker that LISTENs for new jobs, as its claims name it: a claim that comes back
    short records it as waiting on its queues for ``seconds`` (until its next claim), and
    only enqueues into queues with a waiter send a notification (see ``job_claim``)."""

    key: str
    """Unique to the worker (and, in a worker claiming for several sets of tasks, to
    the set)."""
    seconds: float
    """How long the record lasts without another claim: longer than the worker's poll
    interval, so a waiting worker's claims keep it alive."""


def default_worker_id() -> str:
    """host:pid:nonce. The nonce keeps a restarted process that reuses a pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ClaimMethods(QueueBase):
    """Claims, heartbeats and wake-ups: the part of :class:`pgqueue.WorkerProtocol` a
    worker calls to get jobs and keep them."""

    _queues_with_settings: dict[tuple[str, ...], bool]
    lender: ConnectionLender | None
    """Lends the jobs this claims their connection for ``job.transaction()`` (a worker
    sets it); None: they have none to lend."""
    _unwritten_refusals: list[tuple[Job, str]]
    """Claimed jobs whose payload could not be decoded, with their error, whose failed
    attempt could not be written yet: the next claim writes it (see
    :meth:`_refuse_undecodable`)."""

    if TYPE_CHECKING:

        def finish_many(
            self,
            successes: Iterable[tuple[Job, Any]],
            failures: Iterable[tuple[Job, str | BaseException]] = (),
        ) -> OutcomeBatch: ...

    def claim(
        self,
        queues: Collection[str],
        tasks: Collection[str],
        limit: int = 1,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        worker_id: str | None = None,
        mode: str = "skip-locked",
        waiter: Waiter | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` runnable jobs of ``tasks`` in ``queues``, in one statement.

        Jobs come in claim order (priority DESC, run_at, id), each with a fresh
        ``lease_token`` valid for ``lease_seconds`` until a heartbeat extends it.

        A caller that LISTENs (see :meth:`listen`) passes a ``waiter``: enqueues notify
        only queues that a waiter's last claim found short of jobs.

        The queues' settings hold (see :meth:`update_queue`): a paused queue gives no
        job, a limited one no more than its concurrency and rate limits leave room for
        across every worker.

        A claimed job whose payload Python cannot load (see :mod:`pgqueue.jsonb`) is
        not returned: its attempt fails at once, with the reason as its error.

        Once the claim has committed, its jobs are the caller's: what may follow it in
        the same call (a second claim, the failure of such jobs) can fail without
        losing them.

        Runs no hook: ``on_start`` belongs to whoever runs the handler, when it starts
        (the Worker does; a loop of your own may call
        ``queue.hooks.call("on_start", job=job)``).
        """
        params = _claim_params(queues, tasks, limit, lease_seconds, worker_id, mode, waiter)
        if params is None:
            return []
        plain = self._claims_plainly(params)
        return self._claimed(params, mode, plain, self._claim_once(params, mode))

    def _claims_plainly(self, params: Mapping[str, Any]) -> bool:
        """Whether a claim of ``params`` will send the plain claim statement (see
        :meth:`_send_claim`): to be asked before it is sent."""
        return not self._queues_with_settings.get(tuple(params["queues"]), True)

    def _claimed(
        self, params: dict[str, Any], mode: str, plain: bool, claimed: list[Job]
    ) -> list[Job]:
        """The jobs a claim of ``params`` gives its caller, from what its statement
        ``claimed`` (sent plain or not, as ``plain`` says).

        That statement has committed: the jobs are the caller's, whose leases nobody
        else will write until they expire. So nothing here may raise: a statement that
        follows and fails costs what it would have added, never the jobs claimed."""
        limit = params["limit"]
        if plain and self._queues_with_settings[tuple(params["queues"])] and len(claimed) < limit:
            # A queue got settings since the last claim, and the plain claim took
            # nothing from it: claim again, now with the limited statement, so that the
            # caller is not told "no more jobs" (a worker would wait for a notification
            # that was sent before it began to wait).
            try:
                claimed += self._claim_once({**params, "limit": limit - len(claimed)}, mode)
            except Exception as exc:
                # The caller is told of fewer jobs, and the next claim, sent limited,
                # takes the rest (a worker looks again: the jobs are due).
                log.warning(
                    "claim: the second claim, for queues with settings, failed: %s", error_line(exc)
                )
        return self._refuse_undecodable(self._with_dependencies(claimed))

    def _with_dependencies(self, claimed: list[Job]) -> list[Job]:
        """``claimed`` with :attr:`Job.dependencies` set on the jobs enqueued with
        ``depends_on``: one statement for them all, and none for a claim of jobs that
        have none, the common case (the claim says which have some).

        Never raises: the jobs whose dependencies could not be read are not returned;
        their attempt fails at once with the reason (as an undecodable payload's does,
        see :meth:`_refuse_undecodable`), so that a handler never runs without them."""
        waited = [job for job in claimed if job.__dict__.pop(_HAS_DEPENDENCIES, False)]
        if not waited:
            return claimed
        try:
            with self._connection() as conn:
                found = dependencies.dependencies_of_many(
                    jsonb.cursor(conn), self.schema, [job.id for job in waited]
                )
        except Exception as exc:
            log.warning(
                "claim: could not read the dependencies of jobs %s; their attempts fail: %s",
                ", ".join(str(job.id) for job in waited),
                error_line(exc),
            )
            reason = f"pgqueue could not read this job's dependencies: {error_line(exc)}"
            self._unwritten_refusals += [(job, reason) for job in waited]
            unread = {job.id for job in waited}
            return [job for job in claimed if job.id not in unread]
        for job in waited:
            job.attach_dependencies(found.get(job.id, ()))
        return claimed

    def _claim_once(self, params: dict[str, Any], mode: str) -> list[Job]:
        with self._connection() as conn:
            # Statements and COMMIT in one pipeline: a worker cut off after the claim
            # can never leave its transaction open on the server, holding the claimed
            # rows.
            with conn.pipeline():
                claim = self._send_claim(conn, params, mode)
                send_commit(conn)
            return claim()

    def next_run_in(self, queues: Collection[str], tasks: Collection[str]) -> float | None:
        """Seconds until the earliest queued job of ``tasks`` in ``queues`` becomes
        runnable (zero or less: one is runnable now), measured on the database clock so
        a worker whose clock is off still wakes on time; None when none is queued."""
        rows = self._rows("job_next_run_delay", {"queues": list(queues), "tasks": list(tasks)})
        return rows[0]["seconds"] if rows else None

    def forget_waiters(self, waiters: Iterable[Waiter]) -> None:
        """Stop counting ``waiters`` as waiting for jobs (a worker that stops)."""
        keys = [waiter.key for waiter in waiters]
        if keys:
            self._rows("waiters_forget", {"waiters": keys})

    def listen(self, conn: psycopg.Connection) -> None:
        """Subscribe ``conn`` to this schema's new-job notifications. Each notification's
        payload is the name of a queue that just received runnable jobs (never a payload).

        ``conn`` must be a dedicated autocommit connection (not a pooled one: the
        subscription lasts as long as the session); read them with ``conn.notifies()``.
        """
        with self._connection(conn) as c:
            c.execute(self._sql("jobs_listen"))

    def heartbeat(
        self,
        leases: Iterable[Lease],
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        *,
        worker: WorkerRegistration | None = None,
    ) -> set[int]:
        """Extend every lease in one statement; return the ids whose lease was lost.
        With ``worker``, the same statement renews its row in the worker registry (and
        writes it again if it was lost), also when no lease is held.

        A lease whose row another transaction has locked right now (an ack, a cancel,
        the reaper) is neither extended nor reported lost: the next heartbeat decides."""
        leases = list(leases)
        if not leases and worker is None:
            return set()
        rows = self._rows(
            "job_heartbeat_many",
            {
                "ids": [lease.job_id for lease in leases],
                "tokens": [lease.token for lease in leases],
                "lease_seconds": lease_seconds,
                **(NO_WORKER if worker is None else worker.params()),
            },
        )
        return {row["id"] for row in rows}

    def _send_claim(
        self, conn: psycopg.Connection, params: Mapping[str, Any], mode: str
    ) -> Callable[[], list[Job]]:
        """Send the claim and job_claim_times in ``conn``'s current transaction (and
        pipeline); the function returned reads the claimed jobs once they have come
        back, in claim order.

        Queues without settings, the common case, are claimed by job_claim. Queues of
        which one has settings (paused, limited) take job_claim_limited, behind
        job_claim_lock. Which one a claim sends is what the last claim of the same
        queues found (job_claim_times says); job_claim gives no job from a queue that
        has settings, so a stale guess costs one short claim, never a pause or a limit
        ignored (:meth:`claim` then claims again at once)."""
        key = tuple(params["queues"])
        rows = jsonb.cursor(conn, tuples=True)
        times = conn.cursor()
        # The claim's plan is the same for any parameters: see job_claim_plan.
        conn.cursor().execute(self._sql("job_claim_plan"))
        if self._queues_with_settings.get(key, True):
            # Limited queues' claims take turns (see job_claim_lock): in a statement of
            # its own, so that the claim's snapshot, taken after the lock, sees the last
            # claim.
            conn.cursor().execute(self._sql("job_claim_lock"), params)
            rows.execute(self._sql("job_claim_limited", mode), params)
        else:
            rows.execute(self._sql("job_claim", mode), params)
        times.execute(self._sql("job_claim_times"), params)

        def read() -> list[Job]:
            jobs, settings = _claimed_jobs(rows, times, params, self)
            self._queues_with_settings[key] = settings
            return jobs

        return read

    def _refuse_undecodable(self, claimed: list[Job]) -> list[Job]:
        """The claimed jobs a handler can be given. A payload Python could not load
        (:class:`~pgqueue.jsonb.UndecodableJson`) makes its attempt a failed one, with
        the reason as its error, as an unstorable result does.

        Never raises: when that failure cannot be written (the database went away since
        the claim), the jobs are kept, under the leases this claim took, and written
        with the next claim's; a lease that expires first is the reaper's, which
        records the same reason."""
        runnable = []
        refused = []
        for job in claimed:
            # Typed as the dict it should be; a payload Python could not load arrives
            # as UndecodableJson in its place.
            payload: object = job.payload
            if isinstance(payload, jsonb.UndecodableJson):
                refused.append((job, undecodable_payload_error(payload)))
            else:
                runnable.append(job)
        # Taken before the write. Two claims at once on two threads may both take one:
        # the second write then finds its lease gone, and refuses it as lost.
        pending, self._unwritten_refusals = self._unwritten_refusals + refused, []
        if pending:
            try:
                self.finish_many((), pending)
            except Exception as exc:
                log.warning(
                    "claim: could not record the failed attempts of jobs %s, whose payload "
                    "could not be decoded (the next claim tries again): %s",
                    ", ".join(str(job.id) for job, _ in pending),
                    error_line(exc),
                )
                self._unwritten_refusals = pending + self._unwritten_refusals
        return runnable


def _claim_params(
    queues: Collection[str],
    tasks: Collection[str],
    limit: int,
    lease_seconds: float,
    worker_id: str | None,
    mode: str,
    waiter: Waiter | None = None,
) -> dict[str, Any] | None:
    """Checked parameters of ``job_claim``, or None when there is nothing to claim."""
    if mode not in CLAIM_MODES:
        raise ValidationError("mode", f"must be one of {', '.join(CLAIM_MODES)}")
    if limit < 1 or not tasks or not queues:
        return None
    validation.seconds("lease_seconds", lease_seconds, positive=True)
    if waiter is not None:
        validation.seconds("waiter.seconds", waiter.seconds, positive=True)
    return {
        "queues": list(queues),
        "tasks": list(tasks),
        "limit": limit,
        "lease_seconds": lease_seconds,
        "worker_id": worker_id or default_worker_id(),
        "waiter": None if waiter is None else waiter.key,
        "waiter_seconds": None if waiter is None else waiter.seconds,
    }


def _claimed_jobs(
    cur: psycopg.Cursor,
    times_cur: psycopg.Cursor,
    params: Mapping[str, Any],
    owner: AttemptOwner,
) -> tuple[list[Job], bool]:
    """The jobs a claim just returned on ``cur`` (a tuple-row cursor), with the times
    job_claim_times returned on ``times_cur``, in claim order (UPDATE ... RETURNING
    does not keep the claim CTE's order); and whether one of the queues has settings.
    Each knows ``owner``, who claimed it, for job.complete and its siblings."""
    started_at, lease_expires_at, settings = times_cur.fetchone()  # type: ignore[misc]
    result = cur.pgresult
    if result is None or not result.nfields or not result.ntuples:
        return [], settings
    # What job_claim set alike on every row, and so does not return per row.
    shared = {
        "state": JobState.RUNNING,
        "worker_id": params["worker_id"],
        "started_at": started_at,
        "lease_expires_at": lease_expires_at,
        effects.OWNER: owner,
    }
    # Column names straight from the result: cur.description builds a Column object per
    # column on every call.
    columns = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    rows = cur.fetchall()
    # job_claim returns the payloads as text, to be loaded all at once.
    position = columns.index("payload")
    payloads = jsonb.load_json_texts([row[position] for row in rows])
    jobs = Job.from_tuples(columns, rows, shared, payloads=payloads)
    # Marked for _with_dependencies: the jobs enqueued with depends_on (the claim
    # returns their pending_dependencies, NULL for the others, after Job's fields).
    if "pending_dependencies" in columns:
        waited = columns.index("pending_dependencies")
        for job, row in zip(jobs, rows, strict=True):
            if row[waited] is not None:
                job.__dict__[_HAS_DEPENDENCIES] = True
    return sorted(jobs, key=lambda j: (-j.priority, j.run_at, j.id)), settings
