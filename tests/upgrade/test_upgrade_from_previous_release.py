"""Upgrading a schema that the previous release filled, while its workers run.

The previous release (the commit pinned in previous-release.txt, installed into a
virtualenv of its own: see upgrade_release.py) makes the schema, fills it with jobs in
every state and runs two workers of its own on it. This tree's ``pgqueue migrate`` then
applies whatever migrations the tree has beyond that release, with those workers
running. Afterwards:

- no job is lost, and none that nothing was working on has changed;
- the jobs running under the old workers' leases finish on those leases, and the jobs
  waiting for them are released;
- each old worker either keeps working (it claims and finishes jobs that this tree's
  code enqueues) or stops with a non-zero status and one line saying why, never a
  traceback; so does each old command run after the upgrade;
- a worker of this tree drains the rest, beside the old ones.

With no migration beyond the release the upgrade is a no-op, and the test shows that
the old workers keep working on everything.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import psycopg
import pytest
from polling import wait_for
from processes import stop
from upgrade_release import released_file, released_folder
from upgrade_snapshot import snapshot

from pgqueue import Queue, migrations

pytestmark = pytest.mark.slow

MIGRATIONS = "packages/pgqueue-core/src/pgqueue/sql/migrations"
# How long the jobs that run across the upgrade take: long enough that the upgrade
# starts while they run (the test checks that they were running just before it).
RUNNING_SECONDS = 15
OLD_WORKERS = ("old-1", "old-2")
# Fast retries, so that the flaky job's second attempt comes at once.
RETRIES = ("--retry-base", "0.2", "--retry-cap", "1")
IDEMPOTENCY_KEY = "made-before-the-upgrade"
UNIQUE_KEY = "held-across-the-upgrade"
SCHEDULE = "examples-weekly-echo"
# A job's fields that nothing but an enqueue sets.
ENQUEUED_FIELDS = (
    "id",
    "queue",
    "task",
    "payload",
    "priority",
    "max_attempts",
    "timeout_seconds",
    "idempotency_key",
    "unique_key",
    "enqueued_at",
)


def test_released_migrations_are_unchanged(previous_release_commit: str) -> None:
    # A schema that has a migration is never given it again: an edit to a released one
    # would reach new schemas only. Changes go into a new migration.
    released = sorted(
        name
        for name in released_folder(previous_release_commit, MIGRATIONS)
        if re.match(r"^\d{4}_\w+\.sql$", name)
    )
    assert released, f"the release {previous_release_commit} ships no migrations"
    shipped = {f"{m.version:04d}_{m.name}.sql": m.text for m in migrations.available()}
    for name in released:
        assert name in shipped, f"migration {name} of the previous release is gone"
        text = released_file(previous_release_commit, f"{MIGRATIONS}/{name}")
        assert shipped[name] == text, f"migration {name} was changed after it was released"


def states(jobs: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {job_id: job["state"] for job_id, job in jobs.items()}


def settled(
    jobs: dict[str, dict[str, Any]], expected: dict[str, str]
) -> dict[str, dict[str, Any]] | None:
    """``jobs`` if each is in the state ``expected`` names for it, else None."""
    return jobs if states(jobs) == expected else None


def trouble(log: str) -> list[str]:
    """The lines of a worker's log that say something went wrong in the worker itself:
    an error (a failing statement, a service that raised) or trouble it is riding out.
    The jobs' own lines (logger pgqueue.jobs: a failed attempt with its handler's
    traceback, a dead job as an error) say how the jobs went, and are not trouble."""
    return [
        line
        for line in log.splitlines()
        if re.match(r"^\S+ \S+ (ERROR|CRITICAL) (?!pgqueue\.jobs:)", line) or "; retrying" in line
    ]


# What an old worker's reaper meets, once, when an upgrade adds columns to active_jobs:
# its prepared "SELECT job.* FROM active_jobs" now returns more columns, which
# PostgreSQL refuses for a statement prepared before. The reaper logs it and its next
# round, on a connection that prepares the statement anew, reaps as before.
RESULT_TYPE_CHANGED = "cached plan must not change result type"


def trouble_beyond_new_columns(log: str) -> list[str]:
    """:func:`trouble`, but for one reaper round per old worker that failed because the
    upgrade added columns (RESULT_TYPE_CHANGED): a worker riding that out is working."""
    found = trouble(log)
    lines = log.splitlines()
    for index, line in enumerate(lines):
        if line in found and "reaper failed" in line:
            following = lines[index + 1 : index + 40]
            # Its traceback runs to the next record, which starts with the date.
            ends = next(
                (n for n, later in enumerate(following) if re.match(r"^\d{4}-\d\d-\d\d ", later)),
                len(following),
            )
            if any(RESULT_TYPE_CHANGED in later for later in following[:ends]):
                found.remove(line)
                break
    return found


def worker_pid(job: dict[str, Any]) -> int:
    """The pid in a job's worker id (host:pid:nonce)."""
    return int(job["worker_id"].split(":")[1])


def check_works_or_says_why(done: subprocess.CompletedProcess[str], what: str) -> bool:
    """An old command run after the upgrade either works (True) or exits 1 with one
    line about the schema, no traceback (False)."""
    if done.returncode == 0:
        return True
    output = done.stdout + done.stderr
    last = output.strip().splitlines()[-1] if output.strip() else ""
    assert done.returncode == 1, f"{what} exited {done.returncode}: {output}"
    assert "Traceback" not in output, f"{what} failed with a traceback: {output}"
    assert last.startswith("Error: "), f"{what} failed without saying why: {output}"
    assert re.search(r"schema|migrat", last, re.IGNORECASE), f"{what}: {last}"
    return False


def check_stopped_saying_why(worker: subprocess.Popen[bytes], log: str, name: str) -> None:
    """An old worker that stopped after the upgrade did so with a non-zero status and,
    as its last line, why (the schema), with no traceback."""
    last = log.strip().splitlines()[-1] if log.strip() else ""
    assert worker.returncode != 0, f"{name} exited 0 on its own after the upgrade: {log}"
    assert "Traceback" not in log, f"{name} stopped with a traceback: {log}"
    assert re.search(r"schema|migrat", last, re.IGNORECASE), f"{name} stopped saying: {last}"


def test_upgrading_under_the_previous_releases_workers_loses_nothing(
    old_pgqueue, new_pgqueue, database_url: str, upgrade_schema: str
) -> None:
    old, new = old_pgqueue, new_pgqueue
    schema = upgrade_schema
    made = old.run("migrate")
    assert made.returncode == 0, made.stderr
    with psycopg.connect(database_url) as conn:
        released = migrations.applied(conn, schema)
    current = [m.version for m in migrations.available()]
    assert set(released) <= set(current), "the schema records migrations this tree lacks"
    beyond = [version for version in current if version not in released]

    workers = {name: old.start_worker(name, "--queue", "default", *RETRIES) for name in OLD_WORKERS}
    old_pids = {worker.pid for worker in workers.values()}
    new_worker: subprocess.Popen[bytes] | None = None
    queue: Queue | None = None
    try:
        # The example plugin's schedule, written by the old workers, switched off.
        wait_for(
            lambda: SCHEDULE in {s["name"] for s in old.json("schedules", "--json")},
            what="the old workers to write the example schedule",
            interval=0.5,
        )
        assert old.run("schedule", "disable", SCHEDULE).returncode == 0
        schedules_before = {s["name"]: s for s in old.json("schedules", "--json")}

        # Jobs in every state, made by the previous release.
        finished = [old.enqueue("echo", {"n": n}) for n in range(2)]
        keyed = old.enqueue("echo", {"n": "keyed"}, "--idempotency-key", IDEMPOTENCY_KEY)
        dead = old.enqueue("fail", {"message": "planned"}, "--max-attempts", "1")
        orphan = old.enqueue("echo", {}, "--depends-on", str(dead))
        flaky = old.enqueue("flaky", {"fail_times": 1}, "--max-attempts", "3")
        # The queue "later" has no worker until this tree's starts.
        later = old.enqueue("echo", {"n": "later"}, "--queue", "later")
        unique = old.enqueue(
            "echo", {"n": "unique"}, "--queue", "later", "--unique-key", UNIQUE_KEY
        )
        cancelled = old.enqueue("echo", {}, "--queue", "later")
        assert old.run("cancel", str(cancelled)).returncode == 0
        delayed = old.enqueue("echo", {"n": "delayed"}, "--queue", "later", "--delay", "2")
        far = old.enqueue("echo", {"n": "tomorrow"}, "--delay", "86400")
        after_later = old.enqueue("echo", {}, "--depends-on", str(later))
        withdrawn = old.enqueue("echo", {}, "--queue", "later", "--depends-on", str(later))
        assert old.run("cancel", str(withdrawn)).returncode == 0
        # Jobs that run across the upgrade, and jobs waiting for them.
        running = [old.enqueue("sleep", {"seconds": RUNNING_SECONDS}) for _ in range(2)]
        after_running = old.enqueue("echo", {}, "--depends-on", str(running[0]))
        after_both = old.enqueue(
            "echo", {}, "--depends-on", str(after_running), "--depends-on", str(delayed)
        )

        expected_before = {
            **dict.fromkeys([*finished, keyed, flaky], "succeeded"),
            dead: "dead",
            **dict.fromkeys([orphan, cancelled, withdrawn], "cancelled"),
            **dict.fromkeys([later, unique, delayed, far], "queued"),
            **dict.fromkeys(running, "running"),
            **dict.fromkeys([after_running, after_later, after_both], "waiting"),
        }
        ids = sorted(expected_before)
        expected = {str(job_id): state for job_id, state in expected_before.items()}
        before = wait_for(
            lambda: settled(old.snapshot(ids), expected),
            what=f"the jobs in their states before the upgrade: {expected}",
            interval=0.2,
        )
        assert {worker_pid(before[str(job_id)]) for job_id in running} <= old_pids

        # The upgrade, by this tree, with the old workers running their jobs.
        upgraded = new.run("migrate")
        assert upgraded.returncode == 0, upgraded.stderr
        assert upgraded.stdout == (
            f"applied migrations {', '.join(map(str, beyond))} to schema {schema}\n"
            if beyond
            else f"schema {schema} is up to date\n"
        )
        with psycopg.connect(database_url) as conn:
            assert migrations.applied(conn, schema) == current

        # Nothing lost; nothing that nobody was working on changed (running jobs and
        # those waiting for them may have moved on since).
        queue = Queue.connect(database_url, schema=schema, max_size=2)
        after = snapshot(queue, ids)
        moving = {str(job_id) for job_id in [*running, after_running, after_both]}
        for job_id, was in before.items():
            now = after[job_id]
            fields = ENQUEUED_FIELDS if job_id in moving else [f for f in was if f in now]
            assert {f: now[f] for f in fields} == {f: was[f] for f in fields}, job_id
        schedules_after = {s.name: s for s in queue.schedules()}
        assert schedules_after[SCHEDULE].enabled is False
        assert schedules_after[SCHEDULE].disabled_by == schedules_before[SCHEDULE]["disabled_by"]

        # The previous release's commands, run after the upgrade (as an old deployment
        # does until it is replaced): each works, or refuses in one line.
        more: list[int] = []
        check_works_or_says_why(old.run("status", "--json"), "old pgqueue status")
        straggler = old.run("enqueue", "echo", "--payload", '{"n": "old, after"}')
        if check_works_or_says_why(straggler, "old pgqueue enqueue"):
            more.append(int(json.loads(straggler.stdout)["job"]["id"]))
        restarted = old.run("worker", "--burst", "--queue", "nothing-here")
        check_works_or_says_why(restarted, "old pgqueue worker started after the upgrade")

        # This tree's code enqueues; the keys made by the previous release still hold.
        fresh = [queue.enqueue("echo", {"n": f"new {n}"}).job.id for n in range(4)]
        held = queue.enqueue("echo", {"n": "another"}, queue="later", unique_key=UNIQUE_KEY)
        assert (held.created, held.job.id) == (False, unique)
        again = queue.enqueue("echo", {"n": "keyed"}, idempotency_key=IDEMPOTENCY_KEY)
        assert (again.created, again.job.id) == (False, keyed)

        # The old workers, still alone on the queue "default": each keeps working or
        # stops saying why.
        old_side = [*running, after_running, *fresh, *more]

        def old_workers_done() -> bool:
            if all(worker.poll() is not None for worker in workers.values()):
                return True
            jobs = snapshot(queue, old_side)
            return all(job["state"] == "succeeded" for job in jobs.values())

        try:
            wait_for(old_workers_done, what="the old workers", interval=0.2)
        except AssertionError as exc:
            logs = "\n".join(f"--- {name}\n{old.log(name)}" for name in workers)
            raise AssertionError(f"{exc}: {snapshot(queue, old_side)}\n{logs}") from None
        for name, worker in workers.items():
            if worker.poll() is not None:
                check_stopped_saying_why(worker, old.log(name), name)
        still_working = {worker.pid for worker in workers.values() if worker.poll() is None}
        if still_working:
            jobs = snapshot(queue, old_side)
            # Run by the old workers; the running jobs on the leases they had before
            # the upgrade (one attempt: never reaped and run again).
            assert {worker_pid(job) for job in jobs.values()} <= old_pids, jobs
            assert all(jobs[str(job_id)]["attempts"] == 1 for job_id in running), jobs

        # A worker of this tree, beside the old ones, drains the rest.
        new_worker = new.start_worker("new", "--queue", "default", "--queue", "later", *RETRIES)
        expected_after = {
            **expected_before,
            **dict.fromkeys([later, unique, delayed, *running], "succeeded"),
            **dict.fromkeys([after_running, after_later, after_both, *fresh, *more], "succeeded"),
        }
        all_ids = sorted(expected_after)
        final_expected = {str(job_id): state for job_id, state in expected_after.items()}
        try:
            final = wait_for(
                lambda: settled(snapshot(queue, all_ids), final_expected),
                what="every job in its final state",
                interval=0.2,
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {states(snapshot(queue, all_ids))}\n--- new\n{new.log('new')}"
            ) from None
        # Only this tree's worker serves "later"; the delayed job kept its time.
        assert {worker_pid(final[str(j)]) for j in (later, unique, delayed)} == {new_worker.pid}
        assert final[str(far)]["run_at"] == before[str(far)]["run_at"]
        assert {s.name: s.enabled for s in queue.schedules()}[SCHEDULE] is False
    finally:
        if queue is not None:
            queue.close()
        started = [*workers.values(), *([new_worker] if new_worker else [])]
        running_then = [worker for worker in started if worker.poll() is None]
        codes = stop(running_then)

    assert codes == [0] * len(running_then), codes
    for name in [*workers, "new"]:
        log = (new if name == "new" else old).log(name)
        check = trouble if name == "new" else trouble_beyond_new_columns
        assert not check(log), f"{name}: {log}"
