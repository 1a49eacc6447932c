"""The producer's rules: every kind of enqueue, through the queue's pool and inside a
caller's own transaction."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule
from machine import CALLER_TABLE, KEYS, UNIQUE_KEYS, transaction_status
from psycopg import sql
from queue_model import QUEUES, TASK, ModelJob

from pgqueue import (
    BatchItem,
    IdempotencyConflict,
    Job,
    JobSpec,
    UnknownDependencies,
)
from pgqueue.bulk import COPY_MIN_JOBS

UNKNOWN = st.sampled_from([None, None, None, "never", "pruned"])
"""Mostly known dependencies; sometimes one id that is no job (never was, or pruned)."""


@dataclass(frozen=True)
class EnqueueOp:
    """One enqueue a caller makes in its transaction. ``kind`` says which call:

    - plain: ``enqueue``, no key;
    - idempotent / unique: ``enqueue`` with ``key`` / ``unique_key``;
    - dependent: ``enqueue`` with ``depends_on`` the known jobs ``picks`` choose (and an
      ``unknown`` id);
    - many: ``enqueue_many`` of a few keyless jobs; copy: of enough to take COPY;
    - batch: ``enqueue_many`` whose first item depends on a known job and each later
      one on an earlier item (``BatchItem``).
    """

    kind: str
    queue: str
    picks: tuple[int, ...]
    key: str
    unique_key: str
    unknown: str | None


OPS = st.builds(
    EnqueueOp,
    kind=st.sampled_from(["plain", "idempotent", "unique", "dependent", "many", "copy", "batch"]),
    queue=st.sampled_from(QUEUES),
    picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3).map(tuple),
    key=st.sampled_from(KEYS),
    unique_key=st.sampled_from(UNIQUE_KEYS),
    unknown=UNKNOWN,
)
# (how the caller got its connection, what it had done on it before the enqueue):
# its own connection, idle, after a statement of its own, or in autocommit mode; or one
# borrowed from a pool (which commits as the block ends, or rolls back if it raises).
CALLER_SETUPS = st.sampled_from(
    [("own", "idle"), ("own", "mid"), ("own", "autocommit"), ("pool", "idle"), ("pool", "mid")]
)


class _RolledBack(Exception):
    """Raised inside a pool's connection block to have the pool roll it back."""


class ProducingRules:
    """Enqueues of every kind, each predicted by the model: the job created or the one
    a key returns, the state it starts in, or the error that refuses it."""

    # -- through the queue's pool ---------------------------------------------------

    @rule(
        queue=st.sampled_from(QUEUES),
        priority=st.integers(-2, 2),
        delayed=st.booleans(),
        max_attempts=st.integers(1, 3),
        key=st.none() | st.sampled_from(KEYS),
        unique_key=st.none() | st.sampled_from(UNIQUE_KEYS),
    )
    def enqueue(
        self,
        queue: str,
        priority: int,
        delayed: bool,
        max_attempts: int,
        key: str | None,
        unique_key: str | None,
    ) -> None:
        self._step()
        self._enqueue_one(
            None,
            queue=queue,
            priority=priority,
            delayed=delayed,
            max_attempts=max_attempts,
            key=key,
            unique_key=unique_key,
        )

    @rule(
        queue=st.sampled_from(QUEUES),
        priority=st.integers(-2, 2),
        delayed=st.booleans(),
        picks=st.lists(st.integers(0, 1000), min_size=1, max_size=6),
        unknown=UNKNOWN,
        key=st.none() | st.sampled_from(KEYS),
        unique_key=st.none() | st.sampled_from(UNIQUE_KEYS),
    )
    def enqueue_with_dependencies(
        self,
        queue: str,
        priority: int,
        delayed: bool,
        picks: list[int],
        unknown: str | None,
        key: str | None,
        unique_key: str | None,
    ) -> None:
        """Dependencies (a fan-in of up to six) on jobs in any state."""
        self._step()
        depends_on = self._dependencies(picks, unknown)
        if depends_on:
            self._enqueue_one(
                None,
                queue=queue,
                priority=priority,
                delayed=delayed,
                key=key,
                unique_key=unique_key,
                depends_on=depends_on,
            )

    @rule(
        queue=st.sampled_from(QUEUES),
        items=st.lists(
            st.tuples(st.lists(st.integers(0, 1000), max_size=3), st.booleans()),
            min_size=2,
            max_size=4,
        ),
        unknown=UNKNOWN,
        unknown_at=st.integers(0, 3),
    )
    def enqueue_batch_with_dependencies(
        self,
        queue: str,
        items: list[tuple[list[int], bool]],
        unknown: str | None,
        unknown_at: int,
    ) -> None:
        """Each pick names an earlier item of the batch (BatchItem) or, with ``by_id``,
        a job enqueued before; a batch naming an unknown id adds nothing."""
        self._step()
        specs: list[JobSpec] = []
        for index, (picks, by_id) in enumerate(items):
            depends_on: list[int | BatchItem] = []
            if by_id or index == 0:
                depends_on += self._dependencies(picks, None)
            else:
                depends_on += [BatchItem(pick % index) for pick in picks]
            if unknown is not None and index == unknown_at % len(items):
                depends_on += self._dependencies([], unknown)
            specs.append(JobSpec(TASK, {"n": index}, queue=queue, depends_on=depends_on))
        self._enqueue_batch(None, specs)

    @rule(
        shape=st.sampled_from(["fan-in", "fan-out", "chain"]),
        size=st.integers(2, 6),
        queue=st.sampled_from(QUEUES),
        anchor=st.none() | st.integers(0, 1000),
    )
    def enqueue_graph(self, shape: str, size: int, queue: str, anchor: int | None) -> None:
        """One batch shaped as a fan-in (``size`` jobs, then one that waits for all of
        them), a fan-out (one job, then ``size`` that wait for it) or a chain; the jobs
        that start it wait for a known job, the ``anchor``, if one is picked."""
        self._step()
        first = self._dependencies([anchor], None) if anchor is not None else []
        if shape == "fan-in":
            graph = [list(first) for _ in range(size)] + [[BatchItem(i) for i in range(size)]]
        elif shape == "fan-out":
            graph = [list(first)] + [[BatchItem(0)] for _ in range(size)]
        else:
            graph = [list(first)] + [[BatchItem(i)] for i in range(size)]
        specs = [
            JobSpec(TASK, {"n": n}, queue=queue, depends_on=depends_on)
            for n, depends_on in enumerate(graph)
        ]
        self._enqueue_batch(None, specs)

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 4), priority=st.integers(-2, 2))
    def enqueue_many(self, queue: str, count: int, priority: int) -> None:
        self._step()
        specs = [JobSpec(TASK, {"n": n}, queue=queue, priority=priority) for n in range(count)]
        self._enqueue_batch(None, specs)

    # -- inside the caller's transaction --------------------------------------------

    # Every kind of enqueue, depends_on included, leaves the caller's transaction as it
    # found it (idle or open), and while that transaction is open nothing of the
    # dependencies is held: a heartbeat, a claim and an ack of them go through.
    @rule(
        ops=st.lists(OPS, min_size=1, max_size=3),
        setup=CALLER_SETUPS,
        commit=st.booleans(),
        probe=st.sampled_from([None, None, "heartbeat", "claim", "ack"]),
    )
    def enqueue_in_callers_transaction(
        self, ops: list[EnqueueOp], setup: tuple[str, str], commit: bool, probe: str | None
    ) -> None:
        """Enqueues with ``conn=`` the caller's connection, then commit or rollback.

        Each enqueue leaves the caller's transaction as it found it: open (INTRANS)
        once a job is in it, never committed, rolled back or failed. Until the caller
        commits nobody else sees its jobs, and a rollback takes them back (keys too),
        with the caller's own write. While the transaction is open, the worker's calls
        (``probe``: a heartbeat, a claim, an ack) on the jobs it named as dependencies
        neither wait for it nor skip those jobs. In autocommit mode, each enqueue is a
        transaction of its own."""
        self._step()
        via, mode = setup
        committed = self.model
        tentative = copy.deepcopy(committed)
        note = uuid.uuid4().hex
        try:
            with self._caller_connection(via, mode) as conn:
                if mode == "mid":
                    conn.execute(
                        sql.SQL("INSERT INTO {} (note) VALUES (%s)").format(
                            self.table(CALLER_TABLE)
                        ),
                        (note,),
                    )
                self.model = tentative
                try:
                    for op in ops:
                        before = transaction_status(conn)
                        refused = self._enqueue_op(conn, op)
                        self._check_left_as_found(conn, mode, before, refused, op)
                finally:
                    self.model = committed
                created = set(tentative.jobs) - set(committed.jobs)
                if mode != "autocommit":
                    seen = self.visible(created)
                    assert not seen, (
                        f"jobs {sorted(seen)} are visible before the caller's transaction "
                        "committed: the enqueue committed it"
                    )
                if probe is not None:
                    # In autocommit, each job was committed as it was enqueued.
                    models = [tentative] if mode == "autocommit" else [committed, tentative]
                    self._probe(probe, models)
                if via == "pool" and not commit:
                    raise _RolledBack
                if commit:
                    conn.commit()
                else:
                    conn.rollback()
        except _RolledBack:
            pass
        kept = commit or mode == "autocommit"
        self.model = tentative if kept else committed
        assert self.visible(created) == (created if kept else set())
        notes = self.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE note = %s").format(self.table(CALLER_TABLE)),
            (note,),
        )
        assert notes[0][0] == (1 if mode == "mid" and kept else 0), "the caller's own write"

    @contextmanager
    def _caller_connection(self, via: str, mode: str) -> Iterator[psycopg.Connection]:
        if via == "pool":
            with self.pool.connection() as conn:
                assert transaction_status(conn) == "IDLE"
                yield conn
        else:
            with psycopg.connect(self.database_url, autocommit=mode == "autocommit") as conn:
                yield conn

    def _check_left_as_found(
        self, conn: psycopg.Connection, mode: str, before: str, refused: bool, op: EnqueueOp
    ) -> None:
        """An enqueue never commits, rolls back or fails the caller's transaction."""
        after = transaction_status(conn)
        if mode == "autocommit":
            expected = {"IDLE"}
        elif not refused:
            # Its job is in the caller's transaction, which stays open for the caller
            # to commit or roll back.
            expected = {"INTRANS"}
        else:
            # Refused, it added nothing; whatever the caller had begun is still open.
            expected = {before, "INTRANS"} - {"INERROR"}
        assert after in expected, (
            f"{op.kind} enqueue on a caller's connection ({mode}, {before} before) left its "
            f"transaction {after}"
        )

    def _enqueue_op(self, conn: psycopg.Connection, op: EnqueueOp) -> bool:
        """Run ``op`` on ``conn``; True if it was refused."""
        if op.kind == "plain":
            return self._enqueue_one(conn, queue=op.queue)
        if op.kind == "idempotent":
            return self._enqueue_one(conn, queue=op.queue, key=op.key)
        if op.kind == "unique":
            return self._enqueue_one(conn, queue=op.queue, unique_key=op.unique_key)
        if op.kind == "dependent":
            depends_on = self._dependencies(list(op.picks), op.unknown)
            return self._enqueue_one(conn, queue=op.queue, depends_on=depends_on)
        if op.kind in ("many", "copy"):
            count = len(op.picks) if op.kind == "many" else COPY_MIN_JOBS
            specs = [JobSpec(TASK, {"n": n}, queue=op.queue) for n in range(count)]
            return self._enqueue_batch(conn, specs)
        assert op.kind == "batch"
        first: list[int | BatchItem] = list(self._dependencies(list(op.picks[:1]), op.unknown))
        later: list[list[int | BatchItem]] = [
            [BatchItem(pick % index)] for index, pick in enumerate(op.picks, start=1)
        ]
        specs = [
            JobSpec(TASK, {"n": n}, queue=op.queue, depends_on=depends_on)
            for n, depends_on in enumerate([first, *later])
        ]
        return self._enqueue_batch(conn, specs)

    # -- predicting one enqueue ---------------------------------------------------------

    def _enqueue_one(
        self,
        conn: psycopg.Connection | None,
        *,
        queue: str,
        priority: int = 0,
        delayed: bool = False,
        max_attempts: int = 3,
        key: str | None = None,
        unique_key: str | None = None,
        depends_on: list[int] | None = None,
    ) -> bool:
        """``enqueue`` one job on ``conn`` (None: through the pool), checked against the
        model; True if it was refused.

        An unknown dependency refuses the whole enqueue before any key is looked at.
        The idempotency key is looked at first (its job, whatever its state, and a
        conflict if the job differs); then the unique key (its waiting, queued or
        running job)."""
        depends_on = depends_on or []
        options: dict[str, Any] = {
            "queue": queue,
            "priority": priority,
            "delay_seconds": 3600 if delayed else None,
            "max_attempts": max_attempts,
            "idempotency_key": key,
            "unique_key": unique_key,
            "depends_on": depends_on,
            "conn": conn,
        }
        missing = sorted(set(depends_on) - set(self.model.jobs))
        if missing:
            with pytest.raises(UnknownDependencies) as refused:
                self.queue.enqueue(TASK, {}, **options)
            assert refused.value.job_ids == missing and refused.value.index is None
            return True
        holder = None if key is None else self.model.by_key(key)
        if holder is not None and holder.queue != queue:
            with pytest.raises(IdempotencyConflict):
                self.queue.enqueue(TASK, {}, **options)
            return True
        if holder is None and unique_key is not None:
            holder = self.model.unique_holder(unique_key)
        state = self.model.expected_state(set(depends_on))
        outcome = self.queue.enqueue(TASK, {}, **options)
        if holder is not None:
            assert not outcome.created and outcome.job.id == holder.id
            return False
        assert outcome.created and outcome.job.id not in self.model.jobs
        assert outcome.job.state.value == state
        self._add(outcome.job, delayed, key, set(depends_on))
        return False

    def _enqueue_batch(self, conn: psycopg.Connection | None, specs: list[JobSpec]) -> bool:
        """``enqueue_many`` of keyless ``specs`` on ``conn`` (None: through the pool),
        checked against the model; True if it was refused (an unknown dependency: the
        first item naming one is reported, and nothing is added)."""
        known = set(self.model.jobs)
        missing = [
            (index, sorted({d for d in spec.depends_on if isinstance(d, int)} - known))
            for index, spec in enumerate(specs)
        ]
        missing = [(index, ids) for index, ids in missing if ids]
        if missing:
            index, ids = missing[0]
            with pytest.raises(UnknownDependencies) as refused:
                self.queue.enqueue_many(specs, conn=conn)
            assert (refused.value.index, refused.value.job_ids) == (index, ids)
            return True
        results = self.queue.enqueue_many(specs, conn=conn)
        assert len(results) == len(specs) and all(result.created for result in results)
        for spec, result in zip(specs, results, strict=True):
            resolved = {
                results[d.index].job.id if isinstance(d, BatchItem) else d for d in spec.depends_on
            }
            assert result.job.state.value == self.model.expected_state(resolved)
            self._add(result.job, False, None, resolved)
        return False

    def _add(
        self, job: Job, delayed: bool, key: str | None, depends_on: set[int] | None = None
    ) -> None:
        assert job.attempts == 0
        created = ModelJob(
            id=job.id,
            queue=job.queue,
            priority=job.priority,
            max_attempts=job.max_attempts,
            run_at=job.run_at,
            delayed=delayed,
            key=key,
            unique_key=job.unique_key,
            partition=job.partition_key,
        )
        self.model.enqueued(created, depends_on or set())
