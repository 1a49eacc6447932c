"""Storage: the hot path reads the same few pages however much history the table holds,
heartbeats are HOT updates, and the table carries storage parameters for churn.

Cost is counted in buffers (pages the statement touched, from EXPLAIN (ANALYZE,
BUFFERS)), which depend on the data and the plan, not on how busy the machine is.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from polling import wait_for
from psycopg import sql

from pgqueue import JobSpec, Queue, WorkerProtocol, queries
from pgqueue.registry import NO_WORKER

HISTORY_ROWS = 30_000
# A B-tree may grow a level when the history arrives (the primary key does), so a
# statement may touch a page or two more per row it writes; never hundreds more.
SLACK_PER_ROW = 3
SLACK = 10


def _params(name: str) -> dict[str, Any]:
    common = {"queues": ["default"], "tasks": ["t"]}
    return {
        "job_claim": {
            **common,
            "limit": 10,
            "lease_seconds": 30,
            "worker_id": "w",
            "waiter": None,
            "waiter_seconds": None,
        },
        "job_claim_limited": {
            **common,
            "limit": 10,
            "lease_seconds": 30,
            "worker_id": "w",
            "waiter": None,
            "waiter_seconds": None,
        },
        "job_expired_lock": {"limit": 1000},
        "job_next_run_delay": common,
        "queue_stats": {},
        "jobs_unserved": {},
    }[name]


def _buffers(
    db: psycopg.Connection, schema: str, name: str, params: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """Pages the statement called ``name`` touches (shared hits + reads), run for real
    inside a transaction that is rolled back, and its plan. A claim runs as a worker
    runs it: on its generic plan (see job_claim_plan)."""
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + queries.bind(name, schema)
    with db.transaction(force_rollback=True):
        if name.startswith("job_claim"):
            db.execute(queries.bind("job_claim_plan", schema))
        (plan,) = db.execute(explain, _params(name) if params is None else params).fetchone()[0]
    top = plan["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"], top


def _vacuum(db: psycopg.Connection, schema: str) -> None:
    for table in ("active_jobs", "finished_jobs"):
        db.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(schema, table)))


def _index_names(plan: dict[str, Any]) -> set[str]:
    names = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):
        names |= _index_names(child)
    return names


@pytest.fixture
def hot_set(queue: Queue) -> None:
    """A realistic hot set: a backlog of queued jobs and a few running ones."""
    protocol = WorkerProtocol(queue)
    queue.enqueue_many(JobSpec("t", {"n": n}) for n in range(200))
    protocol.claim(["default"], ["t"], limit=5, lease_seconds=0.001)


@pytest.mark.parametrize(
    "name",
    [
        "job_claim",
        "job_expired_lock",
        "job_next_run_delay",
        "queue_stats",
        "jobs_unserved",
    ],
)
def test_hot_path_statements_read_as_few_pages_with_history_as_without(
    name, queue, db, schema, hot_set, history
):
    _vacuum(db, schema)
    without, _ = _buffers(db, schema, name)
    history(HISTORY_ROWS)
    history(HISTORY_ROWS // 20, state="dead")
    _vacuum(db, schema)
    with_history, plan = _buffers(db, schema, name)

    written = plan.get("Actual Rows", 0) if name.startswith("job_") else 0
    assert with_history <= without + SLACK + SLACK_PER_ROW * written, (
        f"{name} touched {with_history} pages with {HISTORY_ROWS} finished jobs in the "
        f"table, {without} without"
    )


def test_claims_use_the_partial_claim_index(queue, db, schema, hot_set, history):
    history(HISTORY_ROWS)
    _vacuum(db, schema)
    _, plan = _buffers(db, schema, "job_claim")
    assert "active_jobs_claim_idx" in _index_names(plan)


UNSERVED_BACKLOG = 30_000


@pytest.mark.parametrize("tasks", [["t"], ["t", "idle"]], ids=["one-task", "with-an-idle-task"])
@pytest.mark.parametrize("name", ["job_claim", "job_claim_limited", "job_next_run_delay"])
def test_claims_read_as_few_pages_with_a_backlog_of_tasks_they_do_not_serve(
    name, tasks, queue, db, schema, hot_set
):
    """A worker serving task t (and one with no job, idle), in a queue that also holds a
    long backlog of a task no one serves (a misspelt name, say), queued before t's jobs:
    its claims and its check of when the next job is due read what they read without
    that backlog."""
    if name == "job_claim_limited":
        # A queue with settings is claimed by job_claim_limited (here: updated_at only).
        queue.update_queue("default", create=True)
    params = {**_params(name), "tasks": tasks}
    _vacuum(db, schema)
    _, plan_without = _buffers(db, schema, name, params)
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, task, payload, run_at)"
            " SELECT 'default', 'typo', '{{}}', now() - interval '1 hour'"
            " FROM generate_series(1, %s)"
        ).format(sql.Identifier(schema, "active_jobs")),
        (UNSERVED_BACKLOG,),
    )
    _vacuum(db, schema)
    _, plan = _buffers(db, schema, name, params)
    with_backlog = _finding(plan)

    assert with_backlog <= _finding(plan_without) + SLACK, (
        f"{name} read {with_backlog} pages to find its jobs with {UNSERVED_BACKLOG} queued "
        f"jobs of a task it does not serve, {_finding(plan_without)} without"
    )


def _pages(node: dict[str, Any]) -> int:
    return node["Shared Hit Blocks"] + node["Shared Read Blocks"]


def _finding(plan: dict[str, Any]) -> int:
    """The pages a statement read to find its jobs: all it touched but what a claim's
    UPDATE of the jobs it chose did (fetch them by primary key, write their new
    versions and index entries), which grows with the jobs claimed and the depth of
    the table's indexes, not with the jobs looked at."""
    pages = _pages(plan)
    for part in plan.get("Plans", []):
        if part["Node Type"] == "ModifyTable" and part.get("Relation Name") == "active_jobs":
            chosen = part.get("Plans", [])
            pages -= _pages(part) - sum(
                _pages(c) for c in chosen if c.get("Parent Relationship") == "InitPlan"
            )
    return pages


HEARTBEAT_JOBS = 20


def test_heartbeats_are_hot_updates(queue, db, schema):
    """A heartbeat changes only lease_expires_at, which no index covers, and the pages
    keep room (fillfactor) for the new row version: PostgreSQL updates the row in place
    on its page without touching any index (a heap-only tuple)."""
    # Few enough jobs that each page keeps room for a new version of each of its rows
    # (fillfactor is a share of the page, not a room per row): which rows have room on a
    # full page depends on the row width, not on what a heartbeat changes.
    protocol = WorkerProtocol(queue)
    queue.enqueue_many(JobSpec("t") for _ in range(HEARTBEAT_JOBS))
    claimed = protocol.claim(["default"], ["t"], limit=HEARTBEAT_JOBS)
    # The room a heartbeat's new row version needs is what the claim's old versions
    # leave once they are pruned. In a worker the first heartbeat comes seconds after
    # the claim, by when pruning or autovacuum has made it; right after the claim the
    # test has to ask for it, or whether the pages had room yet is down to timing. A
    # snapshot older than the claim, in another test's transaction, keeps the old
    # versions until it ends: the heartbeat is tried (and rolled back) until none does.
    heartbeat = queries.bind("job_heartbeat_many", schema)
    jobs = sql.Identifier(schema, "active_jobs").as_string(db)

    def beat() -> tuple[list[Any], int, int]:
        _vacuum(db, schema)
        with db.transaction(force_rollback=True):
            lost = db.execute(
                heartbeat,
                {
                    "ids": [job.id for job in claimed],
                    "tokens": [job.lease_token for job in claimed],
                    "lease_seconds": 30,
                    **NO_WORKER,
                },
            ).fetchall()
            updated, hot = db.execute(
                "SELECT pg_stat_get_xact_tuples_updated(%s::regclass),"
                " pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
                (jobs, jobs),
            ).fetchone()
        return lost, updated, hot

    def every_update_hot() -> tuple[list[Any], int, int] | None:
        outcome = beat()
        return outcome if outcome[2] == HEARTBEAT_JOBS else None

    lost, updated, hot = wait_for(every_update_hot, 60, "heartbeats that are all HOT updates")
    assert lost == []
    assert updated == HEARTBEAT_JOBS
    assert hot == HEARTBEAT_JOBS


def test_the_active_jobs_table_is_stored_for_churn(db, schema):
    options = db.execute(
        "SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
        (f"{schema}.active_jobs",),
    ).fetchone()[0]
    settings = dict(option.split("=", 1) for option in options)
    assert int(settings["fillfactor"]) < 100  # room on each page for HOT heartbeats
    assert float(settings["autovacuum_vacuum_scale_factor"]) < 0.2  # the default
    assert float(settings["autovacuum_vacuum_cost_delay"]) < 2  # the default


def test_finished_jobs_are_not_in_the_active_table_or_its_indexes(db, schema, queue, history):
    protocol = WorkerProtocol(queue)
    history(1000)
    name = f"q_{uuid.uuid4().hex[:6]}"
    queue.enqueue(name, queue=name)
    job = queue.enqueue(name, queue=name).job
    protocol.ack(protocol.claim([name], [name])[0], None)
    _vacuum(db, schema)
    counts = dict(
        db.execute(
            "SELECT c.relname, c.reltuples FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname IN"
            " ('active_jobs', 'active_jobs_claim_idx', 'active_jobs_running_idx')",
            (schema,),
        ).fetchall()
    )
    assert counts == {"active_jobs": 1, "active_jobs_claim_idx": 1, "active_jobs_running_idx": 0}
    assert queue.get(job.id).state.value == "queued"


WORKFLOW_STEPS = 20


@pytest.mark.parametrize("name", ["job_workflow_get", "job_neighbours_get"])
def test_workflow_reads_look_jobs_up_by_id_however_much_history(name, queue, db, schema, history):
    """The dashboard's workflow page and a job's list of linked jobs fetch each job by
    id: what they read does not grow with the finished jobs kept. (Joined to the jobs
    view instead, the planner, which cannot tell how few the linked jobs are, chose to
    sort all 5 million finished jobs of ``pgqueue bench ui`` to merge them in.)"""
    root = queue.enqueue("t", {}).job.id
    steps = queue.enqueue_many(
        JobSpec("t", {"n": n}, depends_on=[root]) for n in range(WORKFLOW_STEPS)
    )
    fan_in = queue.enqueue("t", {}, depends_on=[step.job.id for step in steps]).job.id
    params = {"id": root if name == "job_workflow_get" else fan_in, "limit": 100}
    _vacuum(db, schema)
    without, _ = _buffers(db, schema, name, params)
    history(HISTORY_ROWS)
    history(HISTORY_ROWS // 20, state="dead")
    _vacuum(db, schema)
    with_history, _ = _buffers(db, schema, name, params)
    jobs = WORKFLOW_STEPS + 2
    assert with_history <= without + SLACK + SLACK_PER_ROW * jobs, (
        f"{name} touched {with_history} pages with {HISTORY_ROWS} finished jobs kept, "
        f"{without} without"
    )
