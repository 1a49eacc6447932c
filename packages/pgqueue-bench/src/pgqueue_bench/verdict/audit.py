"""The audit trail a run is judged by, and the judgement of at-least-once it supports.

A trigger (``sql/audit.sql``) writes one row per committed change of a job's state, in
the same transaction as the change, so whatever crashed, froze or was cut off around
it, an ack that committed is in the trail exactly once and one that rolled back is not
there at all. Set against what the producers were told (their acknowledged enqueues)
and what the workers logged, it says which jobs were lost and which were completed
twice, independently of the jobs table the queue itself keeps.

The fault scenarios (``tests/faults``) and the soak (``pgqueue bench soak``) both judge
their runs with it, so it lives here, in the bench package both import.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue_bench.sql.queries import statement_in

SQL_FILE = "audit.sql"
FINISHED = frozenset({"succeeded", "dead", "cancelled"})
PRUNED = "pruned"


def install(url: str, schema: str) -> None:
    """Install the audit trail on the jobs tables of ``schema`` (migrated already)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement_in(SQL_FILE, "audit_install", schema=sql.Identifier(schema)))


def transitions(url: str, schema: str, *, after: int = 0) -> list[dict[str, Any]]:
    """The trail's rows after row ``after`` (default: all), oldest first: ``id``,
    ``job_id``, ``queue``, ``from_state``, ``to_state``, ``lease_token`` (held before the
    change), ``attempts``, ``run_at`` and ``at`` (the trigger's clock)."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        cur = conn.cursor(row_factory=dict_row)
        query = statement_in(SQL_FILE, "audit_transitions", schema=sql.Identifier(schema))
        cur.execute(query, {"after": after})
        return cur.fetchall()


@dataclass
class Judgement:
    """What the trail, the jobs table and the workers' logs say against the producers'
    acknowledged enqueues."""

    final_states: dict[int, str]
    """Each job's state now: in the table, or the state the trail saw it pruned in."""
    lost: list[str] = field(default_factory=list)
    """Keys of acknowledged enqueues missing, or not in a wanted final state."""
    double_acks: list[int] = field(default_factory=list)
    """Jobs whose trail holds more than one committed ack."""
    contradicted_acks: list[tuple[int, int]] = field(default_factory=list)
    """(job, attempt) acks a worker logged as committed that the trail does not hold:
    the job finished otherwise, or by another attempt, or was logged twice."""
    unacknowledged: list[int] = field(default_factory=list)
    """Jobs in the table (or pruned from it) that no producer was told about."""
    acks_written: int = 0
    failed_attempts: int = 0
    """Attempts that ended back in queued or dead: failed by a worker, or reaped."""
    pruned: int = 0

    @property
    def completed_twice(self) -> int:
        """Jobs completed twice, as the database or the workers tell it."""
        return len(self.double_acks) + len(self.contradicted_acks)


def judge(
    acknowledged: Mapping[str, int],
    table_states: Mapping[int, str],
    trail: Iterable[Mapping[str, Any]],
    logged_acks: Sequence[tuple[int, int]],
    *,
    wanted: Iterable[str] = ("succeeded",),
) -> Judgement:
    """Judge a run. ``acknowledged`` maps each enqueue a producer was told had committed
    (its key) to the job id it was given; ``table_states`` is every job in the table
    now with its state; ``logged_acks`` the (job, attempt) acks workers logged as
    committed. A job pruned during the run is judged by the state it was pruned in."""
    rows = list(trail)
    pruned = {row["job_id"]: row["from_state"] for row in rows if row["to_state"] == PRUNED}
    final = dict(table_states) | {
        job_id: state for job_id, state in pruned.items() if job_id not in table_states
    }
    wanted_states = set(wanted)
    acks = Counter(
        (row["job_id"], row["attempts"])
        for row in rows
        if row["from_state"] == "running" and row["to_state"] == "succeeded"
    )
    acked_jobs = Counter(job_id for job_id, _ in acks.elements())
    logged_per_job = Counter(job_id for job_id, _ in logged_acks)
    return Judgement(
        final_states=final,
        lost=[
            key for key, job_id in acknowledged.items() if final.get(job_id) not in wanted_states
        ],
        double_acks=sorted(job_id for job_id, n in acked_jobs.items() if n > 1),
        contradicted_acks=[
            (job_id, attempt)
            for job_id, attempt in logged_acks
            if (job_id, attempt) not in acks or logged_per_job[job_id] > 1
        ],
        unacknowledged=sorted(set(final) - set(acknowledged.values())),
        acks_written=sum(acks.values()),
        failed_attempts=sum(
            1
            for row in rows
            if row["from_state"] == "running" and row["to_state"] in ("queued", "dead")
        ),
        pruned=len(pruned),
    )
