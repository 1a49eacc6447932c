"""One trace from an HTTP request to the worker process that ran its job: the real API
app (instrumented as an application would, spans in memory), the real database, and a
real ``pgqueue worker`` whose SDK a test plugin sets up (spans as JSON lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from processes import environment, start_worker, stop
from serving import serve

from pgqueue_api import ApiSettings, create_app

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def worker_spans(path: Path) -> dict[str, dict[str, Any]]:
    """The worker's consumer spans, by job id."""
    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {
        span["attributes"]["messaging.message.id"]: span
        for span in spans
        if span["kind"] == "SpanKind.CONSUMER"
    }


def test_producer_and_consumer_spans_share_the_trace_across_processes(
    spans: InMemorySpanExporter, database_url: str, schema: str, tmp_path: Path
):
    app = create_app(ApiSettings(database_url=database_url, schema=schema))
    FastAPIInstrumentor.instrument_app(app)
    headers = {"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"}
    with serve(app) as url:
        good = httpx.post(
            f"{url}/jobs", json={"task": "echo", "payload": {"n": 1}}, headers=headers
        )
        bad = httpx.post(
            f"{url}/jobs/batch",
            json={"jobs": [{"task": "fail", "payload": {"message": "no luck"}, "max_attempts": 1}]},
        )
    assert (good.status_code, bad.status_code) == (201, 201)
    good_id = str(good.json()["id"])
    bad_id = str(bad.json()["items"][0]["job"]["id"])

    span_file = tmp_path / "worker-spans.jsonl"
    env = environment(HERE, PGQUEUE_TEST_SPAN_FILE=str(span_file))
    args = ["--database-url", database_url, "--schema", schema, "--burst"]
    args += ["--plugin", "tracing_test_plugin", "--retry-base", "0.05"]
    worker = start_worker(args, env, tmp_path / "worker.log")
    try:
        assert worker.wait(120) == 0, (tmp_path / "worker.log").read_text()
    finally:
        stop([worker])

    producers = {
        span.attributes["messaging.message.id"]: span
        for span in spans.get_finished_spans()
        if span.kind is SpanKind.PRODUCER
    }
    consumers = worker_spans(span_file)
    assert set(consumers) == {good_id, bad_id}
    for job_id, consumer in consumers.items():
        producer = producers[job_id]
        trace_id = f"0x{producer.context.trace_id:032x}"
        span_id = f"0x{producer.context.span_id:016x}"
        assert consumer["context"]["trace_id"] == trace_id
        assert consumer["parent_id"] == span_id
        assert [link["context"]["span_id"] for link in consumer["links"]] == [span_id]
        assert consumer["attributes"]["messaging.system"] == "pgqueue"
        assert consumer["attributes"]["messaging.destination.name"] == "default"
    # The client's trace runs through the API's server span to the worker.
    assert consumers[good_id]["context"]["trace_id"] == f"0x{CLIENT_TRACE}"
    assert consumers[good_id]["status"]["status_code"] == "UNSET"
    failed = consumers[bad_id]
    assert failed["status"]["status_code"] == "ERROR"
    assert failed["attributes"]["error.type"]
    assert [event["name"] for event in failed["events"]] == ["exception"]
