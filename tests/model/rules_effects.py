"""Completion inside the caller's transaction: a holder writes an application row and
completes its job with ``job.complete(conn)`` in one transaction, while the reaper, a
second worker and everything else race it.

A completion runs in two steps, so that other rules can run between them: the holder
opens its transaction and writes its row (which holds nothing of the job), then, in a
later step, completes the job in it and commits or rolls back. In between, the lease
may expire, the reaper take the job and another worker claim it, the job be cancelled,
or nothing happen at all. ``job.complete`` must then raise ``LeaseLost`` exactly when
the model says the lease is no longer the holder's, and a transaction that met
``LeaseLost`` must commit nothing, even if its caller catches it and commits. Between
the completion and the commit, while the transaction holds the job, the reaper, a
claim and heartbeats must go on without waiting for it (they run with a one-second
lock timeout) and without taking the job.

The invariant ``the_application_rows_are_the_committed_completions`` (invariants.py)
holds the table to exactly one row per job completed this way, written by the attempt
that completed it, and none for any other job.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from machine import APPLICATION_TABLE, STATISTICS, WORKERS, transaction_status
from psycopg import sql
from queue_model import Holding

from pgqueue import LeaseLost

# A statement of the completion's transaction that waits is a defect, not a hang.
COMPLETION_OPTIONS = "-c statement_timeout=60s -c lock_timeout=1s"


@dataclass
class PendingCompletion:
    """A holder's transaction, open, with its application row written."""

    worker: str
    holding: Holding
    conn: psycopg.Connection


class EffectsRules:
    """A holder's completion in its own transaction, and the races around it."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: PendingCompletion | None = None
        self.completed_in_transaction: dict[int, object] = {}
        """Jobs completed by a committed job.complete, with the lease token it held."""

    def teardown(self) -> None:
        if self.pending is not None:
            self.pending.conn.close()  # rolls the open transaction back
            self.pending = None
        super().teardown()  # type: ignore[misc]

    @precondition(lambda self: self.pending is None and any(self.model.holdings.values()))
    @rule(pick=st.integers(0, 1000))
    def begin_completion(self, pick: int) -> None:
        """A holder's handler (current or stale) opens a transaction on a connection of
        its own and writes its application row. The worker running it no longer
        heartbeats, acks or fails it meanwhile: the handler has it."""
        self._step()
        held = [(w, h) for w, hs in self.model.holdings.items() for h in hs]
        self._begin(*held[pick % len(held)])

    @precondition(lambda self: self.pending is not None)
    @rule(worker=st.sampled_from(WORKERS))
    def reap_and_reclaim_pending(self, worker: str) -> None:
        """Before the pending transaction completes, its job's lease expires (its
        worker stalled), the reaper takes it back and ``worker`` claims from its queue,
        likely taking it again under a new lease."""
        self._step()
        self._reap_and_reclaim(worker)

    @precondition(
        lambda self: (
            self.pending is None
            and any(self.model.current(h) for hs in self.model.holdings.values() for h in hs)
        )
    )
    @rule(
        pick=st.integers(0, 1000),
        worker=st.sampled_from(WORKERS),
        end=st.sampled_from(["commit", "rollback"]),
    )
    def stalled_holder_completes_after_its_job_was_claimed_again(
        self, pick: int, worker: str, end: str
    ) -> None:
        """The race the fence is for, in one step: a current holder writes its row, stalls
        past its lease, the reaper takes the job and ``worker`` claims it again; then
        the stalled holder completes (LeaseLost), and commits anyway or rolls back.
        Nothing of its transaction commits; the new attempt goes on."""
        self._step()
        held = [
            (w, h) for w, hs in self.model.holdings.items() for h in hs if self.model.current(h)
        ]
        self._begin(*held[pick % len(held)])
        self._reap_and_reclaim(worker)
        self._complete_pending("none", end, worker)

    # One rule per race, so that a pending completion is completed within a few steps
    # (Hypothesis draws among the rules enabled), and the statistics name each race.
    @precondition(lambda self: self.pending is not None)
    @rule(end=st.sampled_from(["commit", "rollback"]))
    def complete_pending(self, end: str) -> None:
        """The pending transaction completes its job, then commits or rolls back."""
        self._step()
        self._complete_pending("none", end, WORKERS[0])

    @precondition(lambda self: self.pending is not None)
    @rule(end=st.sampled_from(["commit", "rollback"]))
    def complete_pending_racing_the_reaper(self, end: str) -> None:
        """A reaper round runs between the completion and the transaction's end."""
        self._step()
        self._complete_pending("reap", end, WORKERS[0])

    @precondition(lambda self: self.pending is not None)
    @rule(end=st.sampled_from(["commit", "rollback"]), worker=st.sampled_from(WORKERS))
    def complete_pending_racing_a_claim(self, end: str, worker: str) -> None:
        """``worker`` claims from the job's queue between the completion and the
        transaction's end."""
        self._step()
        self._complete_pending("claim", end, worker)

    @precondition(lambda self: self.pending is not None)
    @rule(end=st.sampled_from(["commit", "rollback"]))
    def complete_pending_racing_heartbeats(self, end: str) -> None:
        """Both workers heartbeat what they hold between the completion and the
        transaction's end."""
        self._step()
        self._complete_pending("heartbeat", end, WORKERS[0])

    def _complete_pending(self, race: str, end: str, worker: str) -> None:
        """The pending transaction calls ``job.complete(conn, result)``, then, before it
        ends, ``race`` runs (the reaper, a claim by ``worker``, both workers'
        heartbeats, or nothing); then it commits or rolls back."""
        assert self.pending is not None
        pending, self.pending = self.pending, None
        holding, conn = pending.holding, pending.conn
        result = {"completed": holding.job_id, "token": str(holding.token)}
        with conn:
            if not self.model.current(holding):
                with pytest.raises(LeaseLost):
                    holding.claimed.complete(conn, result)
                assert transaction_status(conn) == "INERROR"
                # Caught, LeaseLost still leaves nothing that can commit.
                conn.commit() if end == "commit" else conn.rollback()
                assert self._rows_of(holding) == 0, (
                    f"job {holding.job_id}: a transaction whose job.complete raised "
                    "LeaseLost committed its application row"
                )
                STATISTICS.count(f"completion refused (LeaseLost), then {end}")
                return
            holding.claimed.complete(conn, result)
            raced = self._race_open_completion(race, worker, holding.job_id)
            STATISTICS.count(f"completion accepted, raced by {raced}, then {end}")
            if end == "rollback":
                conn.rollback()
                # Nothing was completed: the attempt goes on, its worker's again.
                self.model.holdings[pending.worker].append(holding)
                return
            conn.commit()
        self.model.finished(holding.job_id, "succeeded")
        self.completed_in_transaction[holding.job_id] = holding.token
        job = self.queue.get(holding.job_id)
        assert job.state.value == "succeeded" and job.result == result, job

    # -- helpers --------------------------------------------------------------------

    def _begin(self, worker: str, holding: Holding) -> None:
        """``worker``'s handler of ``holding`` opens its transaction and writes its row."""
        self.model.holdings[worker].remove(holding)
        conn = self._completion_connection()
        conn.execute(
            sql.SQL("INSERT INTO {} (job_id, token) VALUES (%s, %s)").format(
                self.table(APPLICATION_TABLE)
            ),
            (holding.job_id, holding.token),
        )
        self.pending = PendingCompletion(worker, holding, conn)

    def _reap_and_reclaim(self, worker: str) -> None:
        """The pending job's lease expires, a reaper round takes it back (with every
        other expired lease), and ``worker`` claims from its queue."""
        assert self.pending is not None
        holding = self.pending.holding
        if not self.model.current(holding):
            STATISTICS.count("reap and reclaim: lease already gone")
            return  # already gone: reaped, cancelled, or another attempt's
        self.execute(
            sql.SQL(
                "UPDATE {} SET lease_expires_at = now() - interval '1 second' WHERE id = %s"
            ).format(self.table("active_jobs")),
            (holding.job_id,),
        )
        self.model.lease_expired(holding.job_id)
        expected = set(self.model.reapable(1000))
        reaped = self._protocol().reap(1000)
        assert reaped is not None and {job.id for job in reaped} == expected
        self.model.failed([(job.id, job.run_at) for job in reaped])
        queue = self.model.jobs[holding.job_id].queue
        self._claim(self._protocol(), worker, queue, 3, [self.model])
        job = self.model.jobs[holding.job_id]
        STATISTICS.count(
            "reap and reclaim: claimed again"
            if job.state == "running"
            else f"reap and reclaim: {job.state} after the reap"
        )

    def _completion_connection(self) -> psycopg.Connection:
        """The handler's own connection, outside autocommit: its first statement opens
        the transaction."""
        return psycopg.connect(self.database_url, options=COMPLETION_OPTIONS)

    def _rows_of(self, holding: Holding) -> int:
        [(count,)] = self.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE token = %s").format(
                self.table(APPLICATION_TABLE)
            ),
            (holding.token,),
        )
        return int(count)

    def _race_open_completion(self, race: str, worker: str, job_id: int) -> str:
        """What runs while a completion's transaction holds ``job_id``, on the probe
        pool (which gives up on a lock after a second): none of it may wait for that
        transaction, nor take the job. Returns the race that ran."""
        if race == "reap":
            if any(dependency == job_id for dependency, _ in self.model.edges):
                # The completion holds the waiting jobs it released; a reaped job that
                # dies cancels its own waiting dependents, which may be those, and that
                # cascade waits for the completion's transaction, as it must.
                return "none"
            expected = set(self.model.reapable(1000)) - {job_id}
            reaped = self.probe.reap(1000)
            assert reaped is not None and {job.id for job in reaped} == expected, (
                f"a reaper round took {sorted(job.id for job in reaped or [])} while job "
                f"{job_id}'s completion was open; the model says {sorted(expected)}"
            )
            self.model.failed([(job.id, job.run_at) for job in reaped])
        elif race == "claim":
            queue = self.model.jobs[job_id].queue
            self._claim(self.probe, worker, queue, 3, [self.model])
        elif race == "heartbeat":
            for holder in WORKERS:
                self._heartbeat(self.probe, holder, [self.model])
        else:
            assert race == "none"
        return race
