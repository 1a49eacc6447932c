"""Rows whose jsonb Python cannot load (written around pgqueue, by another client or by
hand) are shown by the API and the dashboard, each such value as its stored text,
never a 500 and never JSON that is not JSON."""

from __future__ import annotations

import json
from typing import Any, NoReturn

import httpx
import psycopg
import pytest
from hostile_json import TOO_DEEP_ARRAYS
from psycopg import sql

from pgqueue import Queue, WorkerProtocol

HUGE = '{"n": 1e5000}'  # printed as 5,001 digits, more than Python converts
POISON = {
    "huge integer": HUGE,
    "too deep": '{"deep": ' + TOO_DEEP_ARRAYS + "}",
    "past float range": '{"x": 1' + "0" * 400 + ".5}",  # Infinity, as a Python float
    # Python loads it; pydantic's encoder stops at 254 levels, pgqueue at 200.
    "deeper than pgqueue stores": '{"deep": ' + "[" * 300 + "]" * 300 + "}",
}


def _refuse(name: str) -> NoReturn:
    raise AssertionError(f"{name} in a response: not JSON")


def strict(response: httpx.Response) -> Any:
    """The body, which must be JSON as RFC 8259 has it (no NaN, no Infinity)."""
    assert response.status_code == 200, response.text[:2000]
    return json.loads(response.text, parse_constant=_refuse)


def _insert(db: psycopg.Connection, schema: str, payload: str) -> int:
    row = db.execute(
        sql.SQL(
            "INSERT INTO {}.active_jobs (queue, task, payload) VALUES ('default', 't', %s) "
            "RETURNING id"
        ).format(sql.Identifier(schema)),
        (payload,),
    ).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def poisoned(queue: Queue, db: psycopg.Connection, schema: str) -> dict[str, int]:
    """A queued job per kind of payload Python cannot load, and a finished job whose
    payload, result, errors and trace context all hold a number it cannot convert."""
    ids = {kind: _insert(db, schema, payload) for kind, payload in POISON.items()}
    finished = queue.enqueue("other", {"n": 1}).job
    protocol = WorkerProtocol(queue)
    protocol.ack(protocol.claim(["default"], ["other"])[0], {"ok": True})
    db.execute(
        sql.SQL(
            "UPDATE {}.finished_jobs SET payload = %s, result = %s, errors = %s, "
            "trace_context = %s WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (HUGE, HUGE, f'[{{"attempt": 1, "error": "x", "n": {HUGE}}}]', HUGE, finished.id),
    )
    ids["finished"] = finished.id
    return ids


def test_a_job_python_cannot_load_is_shown_with_each_such_value_as_its_text(api, poisoned):
    for kind, job_id in poisoned.items():
        body = strict(api.get(f"/jobs/{job_id}"))
        assert body["id"] == job_id
        assert isinstance(body["payload"], str), kind
        assert body["payload"].startswith('{"'), kind
    finished = strict(api.get(f"/jobs/{poisoned['finished']}"))
    assert finished["result"].startswith('{"n": 1000')
    assert finished["errors"].startswith('[{"n": 1000') or '"n": 1000' in finished["errors"]
    listed = strict(api.get("/jobs", params={"limit": 100}))
    assert sorted(job["id"] for job in listed["jobs"]) == sorted(poisoned.values())


def test_the_dashboard_shows_such_a_job_and_why_it_cannot_be_read(api, poisoned):
    for kind, job_id in poisoned.items():
        page = api.get(f"/ui/jobs/{job_id}")
        assert page.status_code == 200, (kind, page.text[:2000])
        assert "could not be decoded" in page.text, kind
        assert api.get(f"/ui/fragments/jobs/{job_id}").status_code == 200
        everything = api.get(f"/ui/jobs/{job_id}/payload.json")
        assert isinstance(strict(everything), str)
    finished = api.get(f"/ui/jobs/{poisoned['finished']}")
    assert "more than 4300 digits" in finished.text
    assert api.get("/ui/jobs").status_code == 200
    assert strict(api.get(f"/ui/jobs/{poisoned['finished']}/result.json")).startswith('{"n"')


def test_a_schedule_whose_stored_payload_python_cannot_load_is_listed(
    api, db: psycopg.Connection, schema: str
):
    db.execute(
        sql.SQL(
            "INSERT INTO {}.schedules (name, cron, timezone, task, queue, payload, priority, "
            "source) VALUES ('nightly', '0 3 * * *', 'UTC', 't', 'default', %s, 0, 'by hand')"
        ).format(sql.Identifier(schema)),
        (HUGE,),
    )
    [schedule] = strict(api.get("/schedules"))["schedules"]
    assert schedule["name"] == "nightly" and schedule["payload"].startswith('{"n": 1000')
    page = api.get("/ui/schedules")
    assert page.status_code == 200 and "nightly" in page.text
