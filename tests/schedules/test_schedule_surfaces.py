"""The schedules as operators see them: ``pgqueue schedules``, ``pgqueue schedule
enable | disable``, ``GET /schedules``, ``PATCH /schedules/{name}`` and the last-run
gauge in ``/metrics``."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import httpx
import psycopg
import pytest
from processes import pgqueue_command
from psycopg import sql
from serving import serve

from pgqueue import Queue
from pgqueue.schedules import Schedule
from pgqueue_api import ApiSettings, create_app

PLUGIN = "reports"


def sync(queue: Queue) -> None:
    queue.sync_schedules(
        {
            "nightly": Schedule(
                "nightly", "30 2 * * *", "report", timezone="Europe/Berlin", source=PLUGIN
            ),
            "often": Schedule("often", "*/10 * * * * *", "ping", queue="fast", source=PLUGIN),
        },
        [PLUGIN],
    )


def run(database_url: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*pgqueue_command(), *args, "--database-url", database_url, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def api(database_url: str, schema: str) -> Iterator[httpx.Client]:
    app = create_app(ApiSettings(database_url=database_url, schema=schema))
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


def test_the_cli_lists_and_switches_schedules(queue: Queue, database_url: str, schema: str) -> None:
    empty = run(database_url, schema, "schedules")
    assert empty.returncode == 0 and empty.stdout.strip() == f"no schedules in schema {schema}"

    sync(queue)
    listed = run(database_url, schema, "schedules")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.strip().splitlines()
    assert header.split() == [
        "name", "cron", "timezone", "task", "queue", "enabled", "next", "run", "last", "run",
    ]  # fmt: skip
    assert len(rows) == 2
    cells = re.split(r"\s{2,}", rows[0].strip())
    assert cells[:6] == ["nightly", "30 2 * * *", "Europe/Berlin", "report", "default", "yes"]
    next_run = datetime.fromisoformat(cells[6]).astimezone(ZoneInfo("Europe/Berlin"))
    assert (next_run.hour, next_run.minute) == (2, 30)
    assert cells[7] == "-"  # never ran

    off = run(database_url, schema, "schedule", "disable", "often")
    assert (off.returncode, off.stdout.strip()) == (0, "schedule often disabled")
    assert " no " in run(database_url, schema, "schedules").stdout.splitlines()[2]
    on = run(database_url, schema, "schedule", "enable", "often")
    assert on.returncode == 0 and on.stdout.startswith("schedule often enabled: next run 20")

    unknown = run(database_url, schema, "schedule", "enable", "nope")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "Error: schedule 'nope' not found"
    assert unknown.stdout == ""


def test_the_api_lists_and_switches_schedules(queue: Queue, api: httpx.Client) -> None:
    assert api.get("/schedules").json() == {"schedules": []}
    sync(queue)
    listed = api.get("/schedules")
    assert listed.status_code == 200
    body = {s["name"]: s for s in listed.json()["schedules"]}
    assert set(body) == {"nightly", "often"}
    nightly = body["nightly"]
    assert (nightly["cron"], nightly["timezone"], nightly["task"], nightly["enabled"]) == (
        "30 2 * * *",
        "Europe/Berlin",
        "report",
        True,
    )
    assert datetime.fromisoformat(nightly["next_run_at"]).tzinfo is not None
    assert nightly["last_run_at"] is None and nightly["source"] == PLUGIN

    off = api.patch("/schedules/nightly", json={"enabled": False})
    assert off.status_code == 200
    assert (off.json()["enabled"], off.json()["disabled_by"], off.json()["next_run_at"]) == (
        False,
        "operator",
        None,
    )
    on = api.patch("/schedules/nightly", json={"enabled": True})
    assert on.status_code == 200 and on.json()["enabled"] and on.json()["next_run_at"]

    missing = api.patch("/schedules/nope", json={"enabled": True})
    assert missing.status_code == 404
    assert missing.json()["detail"] == "schedule 'nope' not found"
    for bad in [{}, {"enabled": "yes"}, {"enabled": 1}, {"enabled": True, "cron": "* * * * *"}]:
        refused = api.patch("/schedules/nightly", json=bad)
        assert refused.status_code == 422, (bad, refused.text)
        assert refused.json()["errors"], bad
    assert api.patch("/schedules/nightly", content=b"{", headers={
        "content-type": "application/json"
    }).status_code == 422  # fmt: skip


def test_metrics_show_when_each_schedule_last_ran(
    queue: Queue, api: httpx.Client, db: psycopg.Connection, schema: str
) -> None:
    sync(queue)
    text = api.get("/metrics").text
    assert "pgqueue_schedule_last_run_timestamp_seconds{" not in text  # none ran yet
    db.execute(
        sql.SQL("UPDATE {}.schedules SET next_run_at = now() - interval '1 second'").format(
            sql.Identifier(schema)
        )
    )
    assert len(queue.run_due_schedules().runs) == 2
    last = {info.name: info.last_run_at for info in queue.schedules()}
    text = api.get("/metrics").text
    for name in ("nightly", "often"):
        line = next(
            line
            for line in text.splitlines()
            if line.startswith(f'pgqueue_schedule_last_run_timestamp_seconds{{schedule="{name}"}}')
        )
        assert float(line.split()[-1]) == pytest.approx(last[name].timestamp())


def test_the_schedule_routes_need_a_token_when_tokens_are_set(
    database_url: str, schema: str
) -> None:
    settings = ApiSettings(database_url=database_url, schema=schema, tokens=frozenset({"s3cret"}))
    with serve(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/schedules").status_code == 401
        assert client.patch("/schedules/a", json={"enabled": False}).status_code == 401
        allowed = client.get("/schedules", headers={"Authorization": "Bearer s3cret"})
        assert allowed.status_code == 200


def test_enabling_a_row_the_scheduler_cannot_read_is_refused_with_its_reason(
    queue: Queue, api: httpx.Client, db: psycopg.Connection, database_url: str, schema: str
) -> None:
    db.execute(
        sql.SQL(
            "INSERT INTO {}.schedules (name, cron, timezone, task, queue, payload, priority, "
            "source, enabled, disabled_by) VALUES ('mars', '0 * * * *', 'Mars/Olympus_Mons', "
            "'tick', 'default', '{{}}', 0, 'elsewhere', false, 'operator')"
        ).format(sql.Identifier(schema))
    )
    reason = "schedule 'mars' cannot run: unknown time zone 'Mars/Olympus_Mons'"
    refused = api.patch("/schedules/mars", json={"enabled": True})
    assert (refused.status_code, refused.json()["detail"]) == (409, reason)

    by_cli = run(database_url, schema, "schedule", "enable", "mars")
    assert (by_cli.returncode, by_cli.stdout) == (1, "")
    assert by_cli.stderr.strip() == f"Error: {reason}"
    assert [info.enabled for info in queue.schedules()] == [False]
