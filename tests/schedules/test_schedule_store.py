"""Schedules in the database: the sync's adds, updates and removals, the operator's
switch across syncs, and the scheduler's round (one job per tick, one run after
downtime, a tick never twice), on real PostgreSQL."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue
from pgqueue.locks import advisory_key
from pgqueue.schedules import Schedule, ScheduleError, ScheduleNotFound, tick_key

PLUGIN = "plugin-a"


def declared(*schedules: Schedule) -> dict[str, Schedule]:
    return {s.name: s for s in schedules}


def hourly(name: str = "hourly", **changes) -> Schedule:
    options = {"cron": "0 * * * *", "task": "tick", "source": PLUGIN, **changes}
    return Schedule(name=name, **options)


def rows(queue: Queue) -> dict[str, object]:
    return {info.name: info for info in queue.schedules()}


def set_due(db: psycopg.Connection, schema: str, name: str, moment: datetime) -> None:
    db.execute(
        sql.SQL("UPDATE {}.schedules SET next_run_at = %s WHERE name = %s").format(
            sql.Identifier(schema)
        ),
        (moment, name),
    )


def database_now(db: psycopg.Connection) -> datetime:
    return db.execute("SELECT now()").fetchone()[0]


def scheduled_jobs(queue: Queue, name: str):
    return [
        j
        for j in queue.list(limit=1000).jobs
        if (j.idempotency_key or "").startswith(f"schedule:{name}@")
    ]


def test_a_sync_adds_updates_and_disables_by_disappearance_and_logs_each(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.schedules")
    report = queue.sync_schedules(declared(hourly("a"), hourly("b")), [PLUGIN])
    assert (report.added, report.updated, report.removed) == (["a", "b"], [], [])
    found = rows(queue)
    assert found["a"].enabled and found["a"].source == PLUGIN
    assert found["a"].next_run_at > datetime.now(UTC) - timedelta(seconds=5)
    assert "schedule a added by plugin plugin-a" in caplog.text

    again = queue.sync_schedules(declared(hourly("a"), hourly("b")), [PLUGIN])
    assert (again.added, again.updated, again.removed, again.unchanged) == ([], [], [], ["a", "b"])

    changed = queue.sync_schedules(
        declared(hourly("a", cron="*/5 * * * *", payload={"v": 2})), [PLUGIN]
    )
    assert (changed.updated, changed.removed) == (["a"], ["b"])
    found = rows(queue)
    assert found["a"].cron == "*/5 * * * *" and found["a"].payload == {"v": 2}
    assert found["a"].next_run_at.minute % 5 == 0
    assert not found["b"].enabled and found["b"].disabled_by == "sync"
    assert found["b"].removed_at is not None and found["b"].next_run_at is None
    assert "schedule a updated by plugin plugin-a: cron '0 * * * *' -> '*/5 * * * *'" in caplog.text
    assert "schedule b disabled: plugin plugin-a no longer declares it" in caplog.text

    # Declared again: back, enabled.
    back = queue.sync_schedules(
        declared(hourly("a", cron="*/5 * * * *", payload={"v": 2}), hourly("b")), [PLUGIN]
    )
    assert back.updated == ["b"]
    b = rows(queue)["b"]
    assert b.enabled and b.disabled_by is None and b.removed_at is None and b.next_run_at


def test_a_sync_leaves_the_schedules_of_plugins_it_did_not_load_alone(queue: Queue) -> None:
    queue.sync_schedules(declared(hourly("theirs", source="plugin-b")), ["plugin-b"])
    report = queue.sync_schedules(declared(hourly("mine")), [PLUGIN])
    assert report.removed == []
    assert rows(queue)["theirs"].enabled


def test_a_sync_with_nothing_to_change_does_not_wait_for_the_scheduler(
    queue: Queue, database_url: str
) -> None:
    queue.sync_schedules(declared(hourly("a")), [PLUGIN])
    with psycopg.connect(database_url) as holder:
        # The scheduler's lock, held as a scheduler round in progress holds it.
        holder.execute(
            "SELECT pg_advisory_xact_lock(%s)", (advisory_key("schedule", queue.schema),)
        )
        reports = []
        sync = threading.Thread(
            target=lambda: reports.append(queue.sync_schedules(declared(hourly("a")), [PLUGIN]))
        )
        sync.start()
        sync.join(20)
        waited = sync.is_alive()
        holder.rollback()
    sync.join(20)
    assert not waited, "a sync that changes nothing waited for the scheduler's lock"
    assert [(r.added, r.updated, r.removed, r.unchanged) for r in reports] == [([], [], [], ["a"])]


def test_the_operators_switch_survives_restarts_and_redefinitions(queue: Queue) -> None:
    queue.sync_schedules(declared(hourly("a")), [PLUGIN])
    off = queue.set_schedule_enabled("a", False)
    assert not off.enabled and off.disabled_by == "operator" and off.next_run_at is None

    queue.sync_schedules(declared(hourly("a")), [PLUGIN])  # a restart
    assert not rows(queue)["a"].enabled
    queue.sync_schedules(declared(hourly("a", cron="15 * * * *")), [PLUGIN])  # a redeploy
    assert not rows(queue)["a"].enabled and rows(queue)["a"].cron == "15 * * * *"
    queue.sync_schedules({}, [PLUGIN])  # removed...
    queue.sync_schedules(declared(hourly("a")), [PLUGIN])  # ...and declared again
    found = rows(queue)["a"]
    assert not found.enabled and found.disabled_by == "operator"

    on = queue.set_schedule_enabled("a", True)
    assert on.enabled and on.disabled_by is None and on.next_run_at.minute == 0
    queue.sync_schedules(declared(hourly("a")), [PLUGIN])
    assert rows(queue)["a"].enabled


def test_an_unknown_schedule_is_not_found(queue: Queue) -> None:
    with pytest.raises(ScheduleNotFound, match="schedule 'nope' not found"):
        queue.set_schedule_enabled("nope", True)


def test_a_due_tick_enqueues_one_job_and_moves_the_schedule_on(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    queue.sync_schedules(declared(hourly("a", payload={"k": 1}, queue="reports")), [PLUGIN])
    tick = database_now(db).replace(minute=0, second=0, microsecond=0)
    set_due(db, schema, "a", tick)

    done = queue.run_due_schedules()
    assert done.ran and [(r.schedule, r.tick, r.created) for r in done.runs] == [("a", tick, True)]
    jobs = scheduled_jobs(queue, "a")
    assert len(jobs) == 1
    job = jobs[0]
    assert (job.task, job.queue, job.payload) == ("tick", "reports", {"k": 1})
    assert job.idempotency_key == tick_key("a", tick)
    info = rows(queue)["a"]
    assert info.last_tick_at == tick and info.last_job_id == job.id
    assert info.last_run_at is not None and info.next_run_at == tick + timedelta(hours=1)
    assert 0 < done.next_due_seconds <= 3600

    assert queue.run_due_schedules().runs == []  # not due again
    assert queue.schedule_last_runs() == {"a": info.last_run_at.timestamp()}


def test_a_tick_that_already_has_its_job_gets_no_second_one(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    """Even if a schedule were moved back to a tick it ran, the key holds."""
    queue.sync_schedules(declared(hourly("a")), [PLUGIN])
    tick = database_now(db).replace(minute=0, second=0, microsecond=0)
    set_due(db, schema, "a", tick)
    first = queue.run_due_schedules().runs[0]
    set_due(db, schema, "a", tick)
    second = queue.run_due_schedules().runs[0]
    assert second.job_id == first.job_id and not second.created
    assert len(scheduled_jobs(queue, "a")) == 1


def test_after_downtime_all_missed_ticks_make_one_run(
    queue: Queue, db: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.schedules")
    queue.sync_schedules(declared(hourly("a", cron="* * * * *")), [PLUGIN])
    now = database_now(db)
    first_missed = now.replace(second=0, microsecond=0) - timedelta(hours=3)
    set_due(db, schema, "a", first_missed)

    done = queue.run_due_schedules()
    assert [(r.tick, r.created) for r in done.runs] == [(first_missed, True)]
    assert len(scheduled_jobs(queue, "a")) == 1
    info = rows(queue)["a"]
    assert info.next_run_at > now and info.next_run_at - now <= timedelta(minutes=1)
    assert "schedule a missed 180 more ticks" in caplog.text or (
        "schedule a missed 179 more ticks" in caplog.text
    )
    assert queue.run_due_schedules().runs == []


def test_a_disabled_schedule_does_not_run_and_enabling_it_skips_what_it_missed(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    queue.sync_schedules(declared(hourly("a", cron="* * * * *")), [PLUGIN])
    set_due(db, schema, "a", database_now(db) - timedelta(hours=1))
    queue.set_schedule_enabled("a", False)
    assert queue.run_due_schedules().runs == []
    on = queue.set_schedule_enabled("a", True)
    assert on.next_run_at > database_now(db) - timedelta(seconds=1)
    assert queue.run_due_schedules().runs == []
    assert scheduled_jobs(queue, "a") == []


def test_rounds_racing_on_many_threads_enqueue_each_tick_once(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    queue.sync_schedules(declared(*(hourly(f"s{i}") for i in range(5))), [PLUGIN])
    tick = database_now(db).replace(minute=0, second=0, microsecond=0)
    for i in range(5):
        set_due(db, schema, f"s{i}", tick)
    start = threading.Barrier(8)
    rounds = []

    def race() -> None:
        start.wait()
        rounds.append(queue.run_due_schedules())

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs = [run for done in rounds for run in done.runs]
    assert sorted(run.schedule for run in runs) == [f"s{i}" for i in range(5)]
    assert all(run.created for run in runs)
    for i in range(5):
        assert len(scheduled_jobs(queue, f"s{i}")) == 1


def insert_row(db: psycopg.Connection, schema: str, name: str, **columns: object) -> None:
    """A schedule row written around pgqueue's sync (another version, or by hand)."""
    values = {
        "cron": "0 * * * *",
        "timezone": "UTC",
        "task": "tick",
        "queue": "default",
        "payload": "{}",
        "priority": 0,
        "source": "elsewhere",
        **columns,
    }
    db.execute(
        sql.SQL(
            "INSERT INTO {}.schedules (name, cron, timezone, task, queue, payload, priority, "
            "source, next_run_at) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, now())"
        ).format(sql.Identifier(schema)),
        (name, *values.values()),
    )


def test_a_row_that_cannot_be_evaluated_is_skipped_until_it_can_and_logged_once(
    queue: Queue, db: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue.schedules")
    queue.sync_schedules(declared(hourly("good")), [PLUGIN])
    tick = database_now(db).replace(minute=0, second=0, microsecond=0)
    set_due(db, schema, "good", tick)
    insert_row(db, schema, "mars", timezone="Mars/Olympus_Mons")
    insert_row(db, schema, "listed", payload="[1, 2]")

    done = queue.run_due_schedules()
    # The good one ran; the others were skipped, each with its reason.
    assert [(r.schedule, r.created) for r in done.runs] == [("good", True)]
    found = rows(queue)
    assert found["good"].error is None
    assert found["mars"].error == "unknown time zone 'Mars/Olympus_Mons'"
    assert found["listed"].error.startswith("payload")
    now = database_now(db)
    for name in ("mars", "listed"):
        assert found[name].enabled
        # Looked at again a minute later: not at every round.
        assert timedelta(seconds=50) < found[name].next_run_at - now <= timedelta(seconds=60)
    assert queue.run_due_schedules().runs == []
    skipped = sorted(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    assert len(skipped) == 2
    assert skipped[1].startswith("schedule mars skipped: unknown time zone 'Mars/Olympus_Mons'")

    # Its time to be looked at again: the same reason is not logged again.
    set_due(db, schema, "mars", database_now(db))
    caplog.clear()
    assert queue.run_due_schedules().runs == []
    assert "mars" not in caplog.text
    assert rows(queue)["mars"].error == "unknown time zone 'Mars/Olympus_Mons'"

    # Fixed (or read by a worker that can): it runs from its next tick, with no run
    # for the time it was skipped.
    db.execute(
        sql.SQL("UPDATE {}.schedules SET timezone = 'UTC' WHERE name = 'mars'").format(
            sql.Identifier(schema)
        )
    )
    set_due(db, schema, "mars", database_now(db))
    assert queue.run_due_schedules().runs == []
    mars = rows(queue)["mars"]
    assert mars.error is None and mars.next_run_at.minute == 0
    assert mars.next_run_at > database_now(db)
    assert "schedule mars can run again" in caplog.text
    assert scheduled_jobs(queue, "mars") == []


def test_enabling_a_row_that_cannot_be_evaluated_says_why(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    insert_row(db, schema, "mars", timezone="Mars/Olympus_Mons")
    queue.set_schedule_enabled("mars", False)
    with pytest.raises(
        ScheduleError, match="schedule 'mars' cannot run: unknown time zone 'Mars/Olympus_Mons'"
    ):
        queue.set_schedule_enabled("mars", True)
    assert not rows(queue)["mars"].enabled


def test_a_sync_that_redefines_a_skipped_row_clears_its_error(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    insert_row(db, schema, "hourly", timezone="Mars/Olympus_Mons", source=PLUGIN)
    queue.run_due_schedules()
    assert rows(queue)["hourly"].error is not None
    queue.sync_schedules(declared(hourly()), [PLUGIN])
    info = rows(queue)["hourly"]
    assert (info.timezone, info.error) == ("UTC", None)
    assert info.next_run_at > database_now(db)


def test_an_operator_who_enables_a_skipped_row_it_can_read_starts_it_at_its_next_tick(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    """A row another worker's round skipped (it could not read it), which this version
    reads: enabled (again), it runs from its next tick, not from when the scheduler
    would have looked again."""
    insert_row(db, schema, "older")
    db.execute(
        sql.SQL(
            "UPDATE {}.schedules SET error = 'invalid cron expression', "
            "next_run_at = now() + interval '37 seconds' WHERE name = 'older'"
        ).format(sql.Identifier(schema))
    )
    info = queue.set_schedule_enabled("older", True)
    assert info.error is None
    assert (info.next_run_at.minute, info.next_run_at.second) == (0, 0)
    set_due(db, schema, "older", info.next_run_at - timedelta(hours=1))
    [run] = queue.run_due_schedules().runs
    assert (run.schedule, run.created) == ("older", True)
