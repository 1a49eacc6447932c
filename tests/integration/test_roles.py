"""The least-privilege roles of ``pgqueue roles grant`` (docs/roles.md), on real
PostgreSQL with real LOGIN roles: a producer enqueues, reads, cancels and retries but
cannot claim, finish, reap, migrate or change the tables; a real ``pgqueue worker`` under
the worker role drains jobs (failures and retries included), registers, syncs and runs
schedules, reaps and prunes, but cannot change the schema; the operator controls queues;
the owner migrates and maintains the history's day partitions.

Roles are cluster-wide: each test's are named after its own schema and dropped after it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest
from polling import wait_for
from processes import environment, pgqueue_command, start_worker, stop
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue import BatchItem, Job, JobSpec, JobState, Queue, WorkerProtocol, migrate, migrations
from pgqueue.effects import CompletionState
from pgqueue.history import Day
from pgqueue.roles import Roles, grant_roles, role_names
from pgqueue.schedules import Schedule

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SCHEDULE_PLUGIN = "schedule_test_plugin"
DENIED = psycopg.errors.InsufficientPrivilege


# The worker process's handlers (``--handlers test_roles:HANDLERS``).
def echo(payload: dict[str, Any]) -> dict[str, Any]:
    """Return the payload."""
    return payload


def flaky(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """Fail the first attempt, succeed the next."""
    if job.attempts == 1:
        raise RuntimeError("first attempt fails on purpose")
    return {"attempt": job.attempts}


def broken(payload: dict[str, Any]) -> None:
    """Fail every attempt."""
    raise RuntimeError("broken on purpose")


HANDLERS = {"echo": echo, "flaky": flaky, "broken": broken}


class Logins:
    """LOGIN roles, one a member of each group role, and their database URLs."""

    def __init__(self, database_url: str, schema: str, groups: Roles) -> None:
        self.database_url = database_url
        self.schema = schema
        self.groups = groups
        self.names = {
            kind: f"{getattr(groups, kind)}_login"
            for kind in ("producer", "worker", "operator", "owner")
        }

    def url(self, kind: str) -> str:
        extra = {}
        if kind == "owner":
            # What the migrator does: act as the group role, so that what it creates
            # belongs to the group, not to this login.
            extra["options"] = f"-c role={self.groups.owner}"
        return make_conninfo(self.database_url, user=self.names[kind], **extra)

    def queue(self, kind: str) -> Queue:
        return Queue.connect(self.url(kind), schema=self.schema, max_size=4)


@pytest.fixture
def logins(database_url: str, schema: str, db: psycopg.Connection) -> Iterator[Logins]:
    """The schema's group roles, granted, and a LOGIN member of each; all dropped after
    the test (with whatever they own or were granted in this database)."""
    groups = grant_roles(database_url, schema)
    made = Logins(database_url, schema, groups)
    try:
        for kind, login in made.names.items():
            db.execute(
                sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                    sql.Identifier(login), sql.Identifier(getattr(groups, kind))
                )
            )
        yield made
    finally:
        for role in [*made.names.values(), *groups.all()]:
            exists = db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if exists:
                db.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
                db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def run_as(url: str, statement: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.format(schema=schema))


def test_a_producer_enqueues_reads_cancels_and_retries(logins: Logins, queue: Queue) -> None:
    with logins.queue("producer") as producer:
        single = producer.enqueue("echo", {"n": 1}).job
        batch = producer.enqueue_many([JobSpec("echo", {"n": n}) for n in range(10)])
        copied = producer.enqueue_many([JobSpec("echo", {"n": n}) for n in range(250)])
        keyed = producer.enqueue("echo", {"n": 2}, idempotency_key="k-1")
        again = producer.enqueue("echo", {"n": 2}, idempotency_key="k-1")
        unique = producer.enqueue("echo", unique_key="u-1")
        held = producer.enqueue("echo", unique_key="u-1")
        waiting = producer.enqueue("echo", depends_on=[single.id]).job
        chained = producer.enqueue_many(
            [JobSpec("echo", idempotency_key="k-2"), JobSpec("echo", depends_on=[BatchItem(0)])]
        )

        assert len(batch) == 10 and all(result.created for result in batch)
        assert len(copied) == 250 and all(result.created for result in copied)
        assert keyed.created and not again.created and again.job.id == keyed.job.id
        assert unique.created and not held.created and held.job.id == unique.job.id
        assert waiting.state is JobState.WAITING
        assert chained[1].job.state is JobState.WAITING
        assert producer.get(copied[-1].job.id).payload == {"n": 249}
        assert producer.get_by_idempotency_key("k-1").id == keyed.job.id
        assert producer.dependencies(waiting.id).depends_on == [single.id]
        assert len(producer.list(state="queued", limit=500).jobs) == 1 + 10 + 250 + 2 + 1

        cancelled = producer.cancel(single.id)
        assert cancelled.state is JobState.CANCELLED
        # Its dependent was cancelled with it, in the producer's transaction.
        assert producer.get(waiting.id).state is JobState.CANCELLED
        assert producer.retry(single.id).state is JobState.QUEUED
        assert {s.queue: s.counts["queued"] for s in producer.stats()} == {"default": 264}
        # A retried dependent waits again; one enqueued in the producer's own
        # transaction is checked as that commits: both as the schema's owner.
        assert producer.retry(waiting.id).state is JobState.WAITING
        with psycopg.connect(logins.url("producer")) as conn:
            later = producer.enqueue("echo", depends_on=[single.id], conn=conn).job
            conn.commit()
        assert producer.dependencies(single.id).dependents == [waiting.id, later.id]
        assert producer.get(later.id).state is JobState.WAITING
        assert producer.workers() == []
        assert producer.schedules() == []
    # Everything the producer wrote is visible to anyone else.
    assert queue.get(waiting.id).state is JobState.WAITING
    assert queue.get(cancelled.id).state is JobState.QUEUED


def test_a_producer_cannot_run_finish_reap_migrate_or_change_tables(
    logins: Logins, queue: Queue, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    claimed = queue.enqueue("echo").job
    [job] = protocol.claim(["default"], ["echo"])
    assert job.id == claimed.id
    producer_url = logins.url("producer")
    with logins.queue("producer") as producer:
        producer_protocol = WorkerProtocol(producer)
        producer.enqueue("echo")
        with pytest.raises(DENIED):
            producer_protocol.claim(["default"], ["echo"])
        with pytest.raises(DENIED):
            producer_protocol.ack(job, None)
        with pytest.raises(DENIED):
            producer_protocol.fail(job, "not mine")
        with pytest.raises(DENIED):
            producer_protocol.reap()
        with pytest.raises(DENIED):
            producer.pause_queue("default")
    with pytest.raises(DENIED):
        migrate(producer_url, schema)
    for statement in (
        "UPDATE {schema}.active_jobs SET state = 'running'",
        "DELETE FROM {schema}.workers",
        "TRUNCATE {schema}.active_jobs",
        "DROP TABLE {schema}.active_jobs",
        "ALTER TABLE {schema}.active_jobs ADD COLUMN extra text",
        "CREATE TABLE {schema}.extra (id int)",
    ):
        with pytest.raises(DENIED):
            run_as(producer_url, statement, schema)
    # The claimed job is untouched.
    assert queue.get(job.id).state is JobState.RUNNING


def _worker_environment(**extra: str) -> dict[str, str]:
    """This folder (the handlers), the schedule tests' plugin and the tests' helpers on
    the worker's path."""
    env = environment(HERE, **extra)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent / "schedules"), str(HERE.parent), env["PYTHONPATH"]]
    )
    return env


WORKER_ARGS = (
    "--handlers",
    "test_roles:HANDLERS",
    "--plugin",
    SCHEDULE_PLUGIN,
    "--no-plugin-autoload",
    "--queue",
    "default",
    "--queue",
    "limited",
    "--retry-base",
    "0.01",
    "--retry-cap",
    "0.01",
    "--poll-interval",
    "0.2",
)


def _start(logins: Logins, schema: str, log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """``pgqueue worker`` as the worker login, with the test handlers and plugin."""
    return start_worker(
        ["--database-url", logins.url("worker"), "--schema", schema, *WORKER_ARGS, *args],
        _worker_environment(PGQUEUE_TEST_SCHEDULES="nightly=0 3 * * *"),
        log_path,
    )


def _finish(process: subprocess.Popen[bytes], log_path: Path, *, burst: bool = False) -> str:
    """Stop the worker (a burst one: wait for it to exit by itself); check it exited 0
    without a privilege error; its output."""
    if burst:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(120)
    [status] = stop([process])
    output = log_path.read_text(errors="replace")
    assert status == 0, output
    assert "permission denied" not in output, output
    return output


def test_a_worker_drains_jobs_registers_syncs_schedules_reaps_and_prunes(
    logins: Logins, queue: Queue, db: psycopg.Connection, schema: str, tmp_path: Path
) -> None:
    # A job whose worker died: running, with its lease expired, for the burst's reap.
    protocol = WorkerProtocol(queue)
    crashed = queue.enqueue("echo").job
    [claimed] = protocol.claim(["default"], ["echo"], worker_id="crashed", lease_seconds=600)
    assert claimed.id == crashed.id
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (crashed.id,),
    )
    first = queue.enqueue("echo", {"n": 1}).job
    then = queue.enqueue("echo", depends_on=[first.id]).job
    retried = queue.enqueue("flaky", max_attempts=3).job
    dead = queue.enqueue("broken", max_attempts=2).job
    doomed = queue.enqueue("echo", depends_on=[dead.id]).job
    many = queue.enqueue_many([JobSpec("echo", {"n": n}) for n in range(300)])
    # A limited queue: its claims lock its settings row and spend its tokens.
    queue.update_queue("limited", rate_limit=1000.0, concurrency_limit=5, create=True)
    limited = queue.enqueue("echo", queue="limited").job

    ids = [crashed.id, first.id, then.id, retried.id, dead.id, doomed.id, limited.id]
    ids += [result.job.id for result in many]
    logs = []
    for run in range(5):  # a retry due a moment after a burst looked is left to the next
        log_path = tmp_path / f"burst-{run}.log"
        logs.append(_finish(_start(logins, schema, log_path, "--burst"), log_path, burst=True))
        if all(queue.get(job_id).state.finished for job_id in ids):
            break
    assert "reaped 1 jobs whose lease expired" in "".join(logs)
    assert queue.get(crashed.id).state is JobState.SUCCEEDED
    assert (queue.get(retried.id).state, queue.get(retried.id).attempts) == (
        JobState.SUCCEEDED,
        2,
    )
    assert queue.get(dead.id).state is JobState.DEAD
    assert queue.get(doomed.id).state is JobState.CANCELLED
    assert queue.get(then.id).state is JobState.SUCCEEDED
    assert queue.get(limited.id).state is JobState.SUCCEEDED
    assert all(queue.get(result.job.id).state is JobState.SUCCEEDED for result in many)

    # A long-running worker: registers, syncs its plugin's schedule, runs the due one,
    # and prunes (a job in the DEFAULT partition, long past its retention).
    db.execute(
        sql.SQL("UPDATE {}.finished_jobs SET finished_at = '2001-01-01' WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        (first.id,),
    )
    log_path = tmp_path / "worker.log"
    process = _start(
        logins, schema, log_path, "--prune-succeeded-after", "1h", "--prune-interval", "0.2"
    )
    try:
        wait_for(lambda: queue.workers(), what="the worker's registration")
        wait_for(lambda: queue.schedules(), what="the schedule sync")
        [nightly] = queue.schedules()
        assert (nightly.name, nightly.source, nightly.enabled) == ("nightly", SCHEDULE_PLUGIN, True)
        db.execute(
            sql.SQL("UPDATE {}.schedules SET next_run_at = now() - interval '1 minute'").format(
                sql.Identifier(schema)
            )
        )
        ticked = wait_for(
            lambda: [job for job in queue.list(task="tick").jobs if job.state.finished],
            what="the schedule's job, run",
        )
        assert ticked[0].state is JobState.SUCCEEDED
        wait_for(
            lambda: first.id not in {job.id for job in queue.list(limit=1000).jobs},
            what="the pruner",
        )
    finally:
        output = _finish(process, log_path)
    assert queue.workers() == []  # it deregistered when it stopped
    assert "schedule nightly" in output

    # As a handler may: retry a job, and prune by hand.
    with logins.queue("worker") as worker:
        assert worker.retry(dead.id).state is JobState.QUEUED
        assert worker.prune(0, ["succeeded"]) >= 300


def test_a_worker_prunes_but_only_the_owner_changes_the_day_partitions(
    logins: Logins, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    done = queue.enqueue("echo").job
    protocol.ack(protocol.claim(["default"], ["echo"])[0], None)
    # A job that finished into a DEFAULT partition (no day covered it).
    db.execute(
        sql.SQL("UPDATE {}.finished_jobs SET finished_at = '2001-01-01' WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        (done.id,),
    )
    week = 7 * 86400.0
    with logins.queue("worker") as worker:
        # Every day it would create exists (migrate made them), none is past retention:
        # the round deletes from the DEFAULT partitions only.
        assert worker.prune_expired({JobState.SUCCEEDED: week}) == 1

        # A coming day that nobody created yet: creating a partition is the owner's.
        today = datetime.now(UTC).date()
        missing = Day(JobState.SUCCEEDED, today + timedelta(days=2))
        db.execute(
            sql.SQL("DROP TABLE {}.{}").format(sql.Identifier(schema), sql.Identifier(missing.name))
        )
        with pytest.raises(DENIED):
            worker.prune_expired({JobState.SUCCEEDED: week})
    with logins.queue("owner") as owner:
        assert owner.prune_expired({JobState.SUCCEEDED: week}) == 0
    assert missing.name in _days(db, schema)

    # A day past its retention: only the owner may drop it.
    old = Day(JobState.SUCCEEDED, date(2001, 1, 2))
    with psycopg.connect(logins.url("owner"), autocommit=True) as conn:
        old.create(conn, schema)
    with logins.queue("worker") as worker, pytest.raises(DENIED):
        worker.prune_expired({JobState.SUCCEEDED: week})
    assert old.name in _days(db, schema)
    with logins.queue("owner") as owner:
        owner.prune_expired({JobState.SUCCEEDED: week})
    assert old.name not in _days(db, schema)


def _days(db: psycopg.Connection, schema: str) -> set[str]:
    rows = db.execute(
        "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname LIKE 'finished_jobs_%%_p%%'",
        (schema,),
    ).fetchall()
    return {row[0] for row in rows}


def test_a_worker_cannot_change_the_schema(logins: Logins, schema: str) -> None:
    worker_url = logins.url("worker")
    for statement in (
        "DROP TABLE {schema}.active_jobs",
        "ALTER TABLE {schema}.active_jobs ADD COLUMN extra text",
        "CREATE TABLE {schema}.extra (id int)",
        "TRUNCATE {schema}.finished_jobs",
        "DELETE FROM {schema}.migrations",
        "DELETE FROM {schema}.schedules",
        "UPDATE {schema}.queue_settings SET paused = true",
        # A worker may insert a row for a queue throttle, naming nothing else.
        "INSERT INTO {schema}.queue_settings (queue, paused) VALUES ('mine', true)",
        "INSERT INTO {schema}.queue_settings (queue, concurrency_limit) VALUES ('mine', 1)",
    ):
        with pytest.raises(DENIED):
            run_as(worker_url, statement, schema)
    with pytest.raises(DENIED):
        migrate(worker_url, schema)


def test_the_operator_controls_queues_and_schedules(logins: Logins, queue: Queue) -> None:
    queue.enqueue("echo")
    with logins.queue("operator") as operator:
        assert operator.pause_queue("default").paused
        assert operator.update_queue("default", concurrency_limit=3).concurrency_limit == 3
        assert not operator.resume_queue("default").paused
        assert operator.stats()[0].concurrency_limit == 3
        queue.sync_schedules({"nightly": Schedule("nightly", "0 3 * * *", "echo")}, [])
        assert not operator.set_schedule_enabled("nightly", False).enabled
        assert operator.set_schedule_enabled("nightly", True).enabled
    with logins.queue("producer") as producer, pytest.raises(DENIED):
        producer.set_schedule_enabled("nightly", False)


def test_the_owner_migrates(logins: Logins, schema: str, db: psycopg.Connection) -> None:
    owner_url = logins.url("owner")
    assert migrate(owner_url, schema) == []
    # A new schema, created by the owner: everything in it belongs to the group role.
    fresh = f"{schema}_new"
    try:
        assert migrate(owner_url, fresh) == [m.version for m in migrations.available()]
        owners = db.execute(
            "SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (fresh,),
        ).fetchall()
        assert owners == [(logins.groups.owner,)]
    finally:
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(fresh)))


def test_roles_grant_command(database_url: str, schema: str, db: psycopg.Connection) -> None:
    names = role_names(schema)
    try:
        done = subprocess.run(
            [
                *pgqueue_command(),
                "roles",
                "grant",
                "--database-url",
                database_url,
                "--schema",
                schema,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert f"producer: {names.producer}" in done.stdout
        assert f"owner: {names.owner}" in done.stdout
        owner = db.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
        assert owner == (names.owner,)
    finally:
        for role in names.all():
            if db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                db.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
                db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_roles_grant_on_a_schema_not_migrated_says_so_in_one_line(database_url: str) -> None:
    done = subprocess.run(
        [
            *pgqueue_command(),
            "roles",
            "grant",
            "--database-url",
            database_url,
            "--schema",
            "never_migrated_here",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: schema never_migrated_here is not migrated: run `pgqueue migrate` first"
    ]


def test_a_worker_completes_and_fences_in_its_own_transaction_and_a_producer_cannot(
    logins: Logins, queue: Queue
) -> None:
    protocol = WorkerProtocol(queue)
    queue.enqueue("echo")
    [job] = protocol.claim(["default"], ["echo"])
    for call in (job.fence, job.complete):
        with psycopg.connect(logins.url("producer")) as conn, pytest.raises(DENIED):
            call(conn)
    assert queue.get(job.id).state is JobState.RUNNING
    with psycopg.connect(logins.url("worker")) as conn:
        job.fence(conn)
        job.complete(conn, "done")
    with logins.queue("worker") as worker:
        [check] = WorkerProtocol(worker).check_completions([job])
    assert check.state is CompletionState.COMMITTED
    assert queue.get(job.id).result == "done"
