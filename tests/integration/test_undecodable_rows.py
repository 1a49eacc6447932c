"""Rows whose jsonb Python cannot load, written around pgqueue's validation (by another
client, an older version, or by hand): each fails only itself, and every reader (claim,
reaper, outcomes, look-ups) still works."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from hostile_json import TOO_DEEP_ARRAYS
from psycopg import sql

from pgqueue import JobState, Queue, WorkerProtocol
from pgqueue.jsonb import UndecodableJson
from pgqueue.schedules import Schedule

pytestmark = pytest.mark.timeout(120)

# What PostgreSQL stores in jsonb and Python's json module cannot load as it is: the
# value as written (PostgreSQL prints numbers in full), and the reason recorded.
POISON = {
    # Printed as 5,001 digits: "Exceeds the limit (4300 digits)".
    "huge integer": ('{"n": 1e5000}', "more than 4300 digits"),
    # Deeper than Python's JSON decoder goes.
    "too deep": ('{"deep": ' + TOO_DEEP_ARRAYS + "}", "nested more deeply"),
    # A float past its range, which Python would read as Infinity.
    "past float range": ('{"x": 1' + "0" * 400 + ".5}", "too large for a float"),
    # Python loads it, but pgqueue never stores one (nor could the API write it back).
    "deeper than pgqueue stores": (
        '{"deep": ' + "[" * 300 + "]" * 300 + "}",
        "nested more than 200 levels deep",
    ),
}


def _insert(db: psycopg.Connection, schema: str, payload: str, task: str = "t", **columns) -> int:
    """A job row written around pgqueue, with any jsonb payload and other columns."""
    names = ["queue", "task", "payload", *columns]
    values = ["default", task, payload, *columns.values()]
    row = db.execute(
        sql.SQL("INSERT INTO {}.active_jobs ({}) VALUES ({}) RETURNING id").format(
            sql.Identifier(schema),
            sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(sql.Placeholder() * len(values)),
        ),
        values,
    ).fetchone()
    assert row is not None
    return row[0]


def _expire(db: psycopg.Connection, schema: str, ids: list[int]) -> None:
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET lease_expires_at = now() - interval '1 second' "
            "WHERE id = ANY(%s)"
        ).format(sql.Identifier(schema)),
        (ids,),
    )


@pytest.mark.parametrize("kind", sorted(POISON))
def test_a_payload_python_cannot_load_fails_its_attempt_and_the_claim_goes_on(
    queue: Queue, db, schema: str, kind: str
):
    payload, reason = POISON[kind]
    first = queue.enqueue("t", {"n": 1}).job
    poison = _insert(db, schema, payload)
    rest = [queue.enqueue("t", {"n": n}).job for n in (2, 3)]
    protocol = WorkerProtocol(queue)

    claimed = protocol.claim(["default"], ["t"], limit=10)

    normal = [first.id, *(job.id for job in rest)]
    assert [job.id for job in claimed] == normal
    assert [job.payload["n"] for job in claimed] == [1, 2, 3]
    # The poison job's attempt failed, saying why; no claimed job is left without a holder.
    stored = queue.get(poison)
    assert (stored.state, stored.attempts) == (JobState.QUEUED, 1)
    assert stored.last_error.startswith("payload could not be decoded: ")
    assert reason in stored.last_error
    assert [job.id for job in queue.list(state="running").jobs] == sorted(normal, reverse=True)
    # A look-up shows it, its payload as the stored text.
    assert isinstance(stored.payload, UndecodableJson) and reason in stored.payload.reason
    for job in claimed:
        protocol.ack(job)


@pytest.mark.parametrize("kind", sorted(POISON))
def test_the_reaper_finishes_an_expired_poison_job_and_every_other_one(
    queue: Queue, db, schema: str, kind: str
):
    payload, reason = POISON[kind]
    protocol = WorkerProtocol(queue)
    # The poison row expired first, so the reaper's oldest-first statement meets it first.
    poison = _insert(
        db,
        schema,
        payload,
        state="running",
        attempts=1,
        lease_token=uuid.uuid4(),
        worker_id="vanished:1:0",
    )
    _expire(db, schema, [poison])
    others = [queue.enqueue("t", {"n": n}).job for n in range(3)]
    protocol.claim(["default"], ["t"], limit=3, worker_id="stalled:2:0")
    _expire(db, schema, [job.id for job in others])

    reaped = protocol.reap()

    assert reaped is not None
    assert sorted(job.id for job in reaped) == sorted([poison, *(job.id for job in others)])
    stored = queue.get(poison)
    assert (stored.state, stored.attempts) == (JobState.QUEUED, 1)
    # It could never have run: that is what its failed attempt says.
    assert stored.last_error.startswith("payload could not be decoded: ")
    assert reason in stored.last_error and "lease expired" in stored.last_error
    assert all(queue.get(job.id).state is JobState.QUEUED for job in others)
    assert protocol.reap() == []


def test_an_error_history_python_cannot_load_neither_blocks_the_outcome_nor_the_reaper(
    queue: Queue, db, schema: str
):
    """job_finish_many returns a failed job's error history: one written by hand with a
    number Python cannot convert made the write fail, retried forever, and the reaper
    roll back on every round."""
    protocol = WorkerProtocol(queue)
    failing, reaped_job = (queue.enqueue("t", {"n": n}).job for n in (1, 2))
    claimed = protocol.claim(["default"], ["t"], limit=2)
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET errors = '[{{\"attempt\": 1e5000}}]' WHERE id = ANY(%s)"
        ).format(sql.Identifier(schema)),
        ([failing.id, reaped_job.id],),
    )
    _expire(db, schema, [reaped_job.id])

    failed = protocol.fail(claimed[0], "boom")
    reaped = protocol.reap()

    assert failed.state is JobState.QUEUED and failed.last_error == "boom"
    assert [job.id for job in reaped or []] == [reaped_job.id]
    for job_id in (failing.id, reaped_job.id):
        stored = queue.get(job_id)
        assert stored.state is JobState.QUEUED
        assert isinstance(stored.errors, UndecodableJson)
        assert "more than 4300 digits" in stored.errors.reason


def test_look_ups_show_every_column_python_cannot_load_as_its_text(queue: Queue, db, schema: str):
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("t", {"n": 1}).job
    [claimed] = protocol.claim(["default"], ["t"])
    protocol.ack(claimed, {"ok": True})
    huge = '{"n": 1e5000}'
    db.execute(
        sql.SQL(
            "UPDATE {}.finished_jobs SET payload = %s, result = %s, errors = %s, "
            "trace_context = %s WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (huge, huge, "[" + huge + "]", huge, job.id),
    )

    for stored in (queue.get(job.id), *queue.list(state="succeeded").jobs):
        assert stored.id == job.id and stored.state is JobState.SUCCEEDED
        for value in (stored.payload, stored.result, stored.errors, stored.trace_context):
            assert isinstance(value, UndecodableJson)
            assert value.startswith('{"n": 1000') or value.startswith('[{"n": 1000')
            assert "more than 4300 digits" in value.reason


def test_a_schedule_whose_stored_payload_python_cannot_load_runs_nothing_and_stops_no_other(
    queue: Queue, db, schema: str, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="pgqueue.schedules")
    hourly = {"cron": "0 * * * *", "task": "tick", "source": "plugin-a"}
    queue.sync_schedules(
        {name: Schedule(name=name, **hourly) for name in ("good", "bad")}, ["plugin-a"]
    )
    now: datetime = db.execute("SELECT now()").fetchone()[0]
    tick = now.replace(minute=0, second=0, microsecond=0)
    db.execute(
        sql.SQL(
            "UPDATE {}.schedules SET next_run_at = %s, "
            """payload = CASE name WHEN 'bad' THEN '{{"n": 1e5000}}' ELSE payload END"""
        ).format(sql.Identifier(schema)),
        (tick,),
    )

    done = queue.run_due_schedules()

    runs = {run.schedule: run for run in done.runs}
    assert runs["good"].job_id is not None and "bad" not in runs
    assert "payload could not be decoded: a number with more than 4300 digits" in caplog.text
    listed = {info.name: info for info in queue.schedules()}
    assert isinstance(listed["bad"].payload, UndecodableJson)
    # Skipped, with the reason to show, and looked at again later, never spinning.
    assert "a number with more than 4300 digits" in (listed["bad"].error or "")
    assert listed["bad"].next_run_at > now


def test_the_cli_shows_a_job_and_a_schedule_python_cannot_load(
    queue: Queue, db, schema: str, database_url: str
):
    job_id = _insert(db, schema, '{"n": 1e5000}')
    queue.sync_schedules(
        {"bad": Schedule(name="bad", cron="0 * * * *", task="tick", source="plugin-a")},
        ["plugin-a"],
    )
    db.execute(
        sql.SQL("""UPDATE {}.schedules SET payload = '{{"n": 1e5000}}'""").format(
            sql.Identifier(schema)
        )
    )
    pgqueue = str(Path(sys.executable).parent / "pgqueue")
    options = ["--database-url", database_url, "--schema", schema]

    def run(*args: str) -> str:
        done = subprocess.run(
            [pgqueue, *args, *options], capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stderr) == (0, "")
        return done.stdout

    shown = json.loads(run("job", str(job_id)))
    assert shown["id"] == job_id and shown["payload"].startswith('{"n": 1000')
    [schedule] = json.loads(run("schedules", "--json"))
    assert schedule["payload"].startswith('{"n": 1000')
    assert "bad" in run("schedules")


@pytest.mark.parametrize(
    "text", ['{"s": "\\ud800"}', '{"x": NaN}', '{"x": Infinity}', '{"s": "\\u0000"}']
)
def test_postgresql_itself_refuses_what_else_python_could_not_write_back(db, text: str):
    """A lone UTF-16 surrogate, NaN and Infinity reach no jsonb column of a UTF-8
    database (and NUL no text): a client that sends one gets an error from PostgreSQL,
    so only the kinds above can be stored. pgqueue still loads each as undecodable
    (tests/unit/test_jsonb.py), for values that come from elsewhere."""
    with pytest.raises(psycopg.errors.DataError):
        db.execute("SELECT %s::jsonb", (text,))
