"""Scenario 10: a server with tight ``statement_timeout`` and
``idle_in_transaction_session_timeout`` (and, from PostgreSQL 17, ``transaction_timeout``),
as many managed services set them.

The queue's own statements and transactions (claims, batched acks, heartbeats, the
reaper's locked round, enqueues, the API's reads) must stay well inside them: no
statement cancelled, no session ended, under load.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from fault_support import SCHEMA, FaultRun, send_via_api, serve_api

from pgqueue_api import ApiSettings

LIMIT = "1s"
TIMEOUT_MESSAGES = (
    "canceling statement due to statement timeout",
    "idle-in-transaction timeout",
    "transaction timeout",
)


def test_the_queues_statements_stay_inside_the_servers_timeouts(
    start_server, postgres_binaries, record_figures, tmp_path: Path
) -> None:
    limits = {"statement_timeout": LIMIT, "idle_in_transaction_session_timeout": LIMIT}
    if postgres_binaries.major >= 17:
        limits["transaction_timeout"] = LIMIT
    server = start_server(settings=limits)
    url = server.url()
    # The limits bite: a statement that overstays is cancelled (or, with
    # transaction_timeout as short, its session ended).
    with psycopg.connect(url) as conn, pytest.raises(psycopg.DatabaseError, match="timeout"):
        conn.execute("SELECT pg_sleep(1.5)")
    log_before = len(server.log_path.read_text(errors="replace"))

    settings = ApiSettings(database_url=url, schema=SCHEMA)
    with FaultRun.prepared(url, tmp_path) as run, serve_api(settings) as api:
        workers = run.start_workers(2)
        run.produce(300, send=send_via_api(api), pause=0.01)
        run.produce(100, pause=0.01)
        # Every other route an operator uses, while the workers are busy.
        later = api.post("/jobs", json={"task": "fault_work", "delay_seconds": 3600}).json()
        run.acknowledge({"later": later["id"]})
        answers = [
            api.post(f"/jobs/{later['id']}/cancel").status_code,
            api.post(f"/jobs/{later['id']}/retry").status_code,
            api.get("/jobs", params={"limit": 1000}).status_code,
            api.get("/queues").status_code,
            api.get("/metrics").status_code,
            api.get("/healthz").status_code,
        ]
        run.wait_until_done()
        verdict = run.verdict()
        logs = workers.logs()
        server_log = server.log_path.read_text(errors="replace")[log_before:]

    assert answers == [200, 200, 200, 200, 200, 200]
    assert [m for m in TIMEOUT_MESSAGES if m in server_log] == []
    assert "database unavailable" not in logs
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 401}
    record_figures(
        "10-server-timeouts",
        verdict.figures(
            jobs=verdict.jobs + 1,
            server_limits=limits,
            statements_cancelled=0,
            sessions_ended=0,
        ),
    )
