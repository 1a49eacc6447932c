"""The state machine's base: one example's schema, queue and model, and the helpers its
rules share (tests/model/rules_*.py hold the rules, invariants.py the invariants)."""

from __future__ import annotations

import sys
from datetime import date
from typing import Any

import psycopg
import psycopg_pool
from hypothesis.stateful import RuleBasedStateMachine, initialize
from model_results import ModelStatistics
from psycopg import sql
from queue_model import QueueModel

from pgqueue import Job, Queue, WorkerProtocol, history

WORKERS = ("w0", "w1")
KEYS = ("k0", "k1", "k2")
UNIQUE_KEYS = ("u0", "u1")
# An id no job ever has in an example.
NEVER_A_JOB = 2**40
# Backoffs of at most this long: a claim sleeps longer first, so every retried job is
# runnable when the model says it is.
BACKOFF_SECONDS = 0.001
# Leases outlast any example, so that only the test expires them.
LEASE_SECONDS = 600.0
# Where a caller's own writes go, beside the jobs it enqueues in the same transaction.
CALLER_TABLE = "model_caller_writes"
# Where a handler's side effects go, one row per run that completes its job in the same
# transaction (rules_effects.py): no unique constraint, so that a second row would stay.
APPLICATION_TABLE = "model_application_rows"

STATISTICS = ModelStatistics()


class MachineBase(RuleBasedStateMachine):
    """One example: a schema as new, a queue on it, and the model beside it."""

    schema: str
    """Migrated once per test, and reset for each example."""
    pool: psycopg_pool.ConnectionPool
    """The queue's pool, also the one the test reads the database through."""
    probe_pool: psycopg_pool.ConnectionPool
    """A pool whose statements give up on a lock after a second: for the worker's calls
    made while a producer's transaction is open (a wait there is a defect, not a hang)."""
    database_url: str

    def __init__(self) -> None:
        super().__init__()
        self.today = self._reset_schema()
        """The UTC date the example started on (see same_day)."""
        self.queue = Queue(
            self.pool, schema=self.schema, retry_base=BACKOFF_SECONDS, retry_cap=BACKOFF_SECONDS
        )
        self.probe = WorkerProtocol(
            Queue(
                self.probe_pool,
                schema=self.schema,
                retry_base=BACKOFF_SECONDS,
                retry_cap=BACKOFF_SECONDS,
            )
        )
        self.model = QueueModel()
        self.configured: set[str] = set()
        """Queues given settings: they exist whether or not they ever had a job."""
        self.days_made = False
        """Whether the past days' partitions were made (see age_history)."""
        STATISTICS.examples += 1

    def _reset_schema(self) -> date:
        """Make the schema as ``migrate`` left it: every table emptied (but the record
        of migrations), every sequence restarted, the past days' partitions dropped;
        return today's date (UTC) on the database's clock.
        A small part of the time a new schema takes, which counts when Hypothesis
        shrinks a failure by replaying hundreds of examples. Rows are deleted, not
        truncated: the tables are small, and a TRUNCATE makes new files for each."""
        with self.pool.connection() as conn:
            tables = conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace "
                "AND relkind IN ('r', 'p') AND NOT relispartition AND relname <> 'migrations'",
                (self.schema,),
            ).fetchall()
            sequences = conn.execute(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (self.schema,)
            ).fetchall()
            for (name,) in tables:
                conn.execute(sql.SQL("DELETE FROM {}").format(self.table(name)))
            for (name,) in sequences:
                conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(self.table(name)))
            days, today, _ = history.days(conn, self.schema)
            for day in days:
                if day.day < today:
                    conn.execute(sql.SQL("DROP TABLE {}").format(self.table(day.name)))
        return today

    def same_day(self) -> bool:
        """Whether it is still the UTC day the example started on. The rules that move
        a job's history days back rely on it: across midnight, which partition a day
        back is, and when it expires, change under them."""
        with self.pool.connection() as conn:
            _, today, _ = history.days(conn, self.schema)
        return today == self.today

    @initialize()
    def start(self) -> None:
        self.model.holdings = {worker: [] for worker in WORKERS}

    def _step(self) -> None:
        """Count a rule run, by the rule's name (the caller's function)."""
        STATISTICS.steps += 1
        name = sys._getframe(1).f_code.co_name
        STATISTICS.rules[name] = STATISTICS.rules.get(name, 0) + 1

    # -- the database, as the test reads and writes it ------------------------------

    def table(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.schema, name)

    def execute(self, statement: sql.Composable, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement of the test's own on a pooled connection; its rows."""
        with self.pool.connection() as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def visible(self, ids: set[int]) -> set[int]:
        """Which of ``ids`` another session sees as jobs."""
        rows = self.execute(
            sql.SQL("SELECT id FROM {} WHERE id = ANY(%s)").format(self.table("jobs")),
            (sorted(ids),),
        )
        return {row[0] for row in rows}

    # -- helpers of the rules -------------------------------------------------------

    def _dependencies(self, picks: list[int], unknown: str | None) -> list[int]:
        """Ids of known jobs (any state) picked by ``picks``, and one unknown id: one
        never used, or one of a pruned job (if any, else none)."""
        ids = sorted(self.model.jobs)
        chosen = [ids[pick % len(ids)] for pick in picks] if ids else []
        if unknown == "never":
            chosen.append(NEVER_A_JOB)
        elif unknown == "pruned" and self.model.pruned_ids:
            pruned = sorted(self.model.pruned_ids)
            chosen.append(pruned[len(chosen) % len(pruned)])
        return chosen

    def _pick(self, pick: int, states: tuple[str, ...] | None = None) -> Any:
        """A job picked by ``pick``: one in ``states`` if there is one, else any."""
        ids = sorted(self.model.jobs)
        if states is not None:
            ids = [i for i in ids if self.model.jobs[i].state in states] or ids
        return self.model.jobs[ids[pick % len(ids)]]

    def _protocol(self) -> WorkerProtocol:
        return WorkerProtocol(self.queue)


def transaction_status(conn: psycopg.Connection) -> str:
    """The caller's connection's transaction status, by name (IDLE, INTRANS, INERROR)."""
    return conn.info.transaction_status.name


def job_ids(jobs: list[Job]) -> list[int]:
    return [job.id for job in jobs]
