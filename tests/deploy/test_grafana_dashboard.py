"""deploy/grafana/pgqueue.json: a Grafana dashboard whose every query asks only for
metrics that pgqueue serves, checked against a real API's /metrics and a real worker's
metrics endpoint after they have seen jobs succeed and fail."""

from __future__ import annotations

import json
import re
import signal
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_for
from processes import environment, start_worker, stop
from prometheus_client.parser import text_string_to_metric_families
from serving import serve

from pgqueue import JobState, Queue
from pgqueue_api import ApiSettings, create_app

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pgqueue.json"
# Every metric pgqueue serves is named pgqueue_*; a worker also serves the process_*
# and python_* metrics of prometheus_client. Label names never start with these.
METRIC_NAME = re.compile(r"\b((?:pgqueue|process|python)_[A-Za-z0-9_]+)")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in board["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # collapsed rows hold theirs
    return found


def queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets and the template variables' queries."""
    exprs = [target["expr"] for panel in panels(board) for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
        elif variable["type"] == "query":
            exprs.append(query)
    return exprs


def exposed_names(text: str) -> set[str]:
    """The sample names a /metrics text holds (families with no sample yet included)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def test_the_dashboard_covers_what_an_operator_watches():
    board = dashboard()
    titles = " ".join(panel["title"].lower() for panel in panels(board))
    for topic in ("throughput", "depth", "age", "failures", "dead", "workers", "latency"):
        assert topic in titles, topic
    assert board["uid"] == "pgqueue"
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_every_metric_the_dashboard_queries_is_served(
    database_url: str, schema: str, queue: Queue, tmp_path: Path
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(ApiSettings(database_url=database_url, schema=schema))
    with serve(app) as url:
        ok = httpx.post(f"{url}/jobs", json={"task": "echo"}).json()["id"]
        bad = httpx.post(f"{url}/jobs", json={"task": "fail", "max_attempts": 1}).json()["id"]
        args = ["--database-url", database_url, "--schema", schema, "--metrics-port", str(port)]
        args += ["--metrics-host", "127.0.0.1"]
        worker = start_worker(args, environment(tmp_path), tmp_path / "worker.log")
        try:
            wait_for(
                lambda: (
                    queue.get(ok).state is JobState.SUCCEEDED
                    and queue.get(bad).state is JobState.DEAD
                ),
                60,
                what="the jobs to finish",
            )
            served = exposed_names(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
            worker.send_signal(signal.SIGTERM)
        finally:
            stop([worker])
        served |= exposed_names(httpx.get(f"{url}/metrics").text)

    asked = {name for expr in queries(dashboard()) for name in METRIC_NAME.findall(expr)}
    assert asked, "no metric found in the dashboard's queries"
    assert asked - served == set()
