"""Schedule rows the scheduler cannot evaluate (an unknown time zone, a cron expression
this croniter does not read, a payload Python cannot decode, as another version or a
hand may write them): a real ``pgqueue worker`` skips each one with one log line, shows
why in ``pgqueue schedules``, ``GET /schedules`` and ``/ui/schedules``, and keeps the
other schedules ticking."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import psycopg
import pytest
from hostile_json import TOO_DEEP_OBJECTS as TOO_DEEP
from polling import wait_for
from processes import pgqueue_command, stop
from psycopg import sql
from serving import serve
from test_schedule_workers import Workers, assert_one_job_per_tick, ticks

from pgqueue_api import ApiSettings, create_app

pytestmark = pytest.mark.slow

BAD_ROWS = {
    # name: (cron, timezone, payload as JSON text, the reason shown)
    "bad-zone": ("* * * * * *", "Mars/Olympus_Mons", "{}", "unknown time zone 'Mars/Olympus_Mons'"),
    "bad-cron": (
        "0 0 12 * * * 2030",
        "UTC",
        "{}",
        "invalid cron expression '0 0 12 * * * 2030'",
    ),
    "bad-payload": (
        "* * * * * *",
        "UTC",
        TOO_DEEP,
        "payload could not be decoded: JSON nested more deeply than Python can decode",
    ),
}


def insert_bad_rows(db: psycopg.Connection, schema: str) -> None:
    for name, (cron, timezone, payload, _) in BAD_ROWS.items():
        db.execute(
            sql.SQL(
                "INSERT INTO {}.schedules (name, cron, timezone, task, queue, payload, "
                "priority, source, next_run_at) "
                "VALUES (%s, %s, %s, 'tick', 'default', %s::jsonb, 0, 'elsewhere', now())"
            ).format(sql.Identifier(schema)),
            (name, cron, timezone, payload),
        )


def test_unevaluable_rows_are_skipped_with_one_line_each_and_their_reason_shown(
    tmp_path: Path, database_url: str, schema: str, db: psycopg.Connection
) -> None:
    insert_bad_rows(db, schema)
    workers = Workers(
        tmp_path, database_url, schema, PGQUEUE_TEST_SCHEDULES="every-second=* * * * * *"
    )
    try:
        workers.start()
        workers.wait_for_log(0, "scheduler on")
        wait_for(lambda: len(ticks(db, schema)) >= 5, 60, what="five ticks of every-second")
    finally:
        codes = stop(workers.processes)
    log = workers.log(0)
    assert codes == [0], log

    # One line for each row it cannot evaluate, however many rounds met it.
    for name in BAD_ROWS:
        lines = [line for line in log.splitlines() if f"schedule {name}" in line]
        assert len(lines) == 1, (name, len(lines), lines[:5])
    # The good schedule kept firing: one job per tick, none missing.
    assert_one_job_per_tick(ticks(db, schema))

    stored = {
        row[0]: row[1:]
        for row in db.execute(
            sql.SQL("SELECT name, enabled, error FROM {}.schedules").format(sql.Identifier(schema))
        ).fetchall()
    }
    assert stored["every-second"] == (True, None)
    for name, (*_, reason) in BAD_ROWS.items():
        enabled, error = stored[name]
        assert enabled and error is not None and error.startswith(reason), (name, error)

    # pgqueue schedules
    listed = subprocess.run(
        [*pgqueue_command(), "schedules", "--database-url", database_url, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    for name, (*_, reason) in BAD_ROWS.items():
        (line,) = [line for line in listed.stdout.splitlines() if line.startswith(name + " ")]
        assert f"skipped: {reason}" in line, line
    as_json = subprocess.run(
        [
            *pgqueue_command(),
            "schedules",
            "--json",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    errors = {item["name"]: item["error"] for item in json.loads(as_json.stdout)}
    assert errors["every-second"] is None
    assert errors["bad-zone"].startswith(BAD_ROWS["bad-zone"][3])

    # GET /schedules and /ui/schedules
    app = create_app(ApiSettings(database_url=database_url, schema=schema))
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        body = {s["name"]: s for s in client.get("/schedules").json()["schedules"]}
        assert body["every-second"]["error"] is None
        for name, (*_, reason) in BAD_ROWS.items():
            assert body[name]["error"].startswith(reason), body[name]
        page = client.get("/ui/schedules")
        assert page.status_code == 200
        for name, (*_, reason) in BAD_ROWS.items():
            row = page.text.split(f'data-schedule="{name}"', 1)[1].split("</tr>", 1)[0]
            assert "skipped" in row and reason.replace("'", "&#39;") in row, row
