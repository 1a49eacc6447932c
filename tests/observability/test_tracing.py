"""OpenTelemetry tracing in one process: producer spans of enqueues, the trace context
stored with each job and carried by every statement that moves it, and the worker's
consumer span per attempt. Spans come from the SDK's in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from psycopg import sql
from serving import serve

from pgqueue import JobSpec, JobState, Queue, WorkerProtocol, tracing
from pgqueue.bulk import COPY_MIN_JOBS
from pgqueue_api import ApiSettings, create_app
from pgqueue_worker import Worker

# The SDK's provider, by the entry-point name OpenTelemetry's API loads it under.
NAMED_PROVIDER = {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}


def traceparent(span: Any) -> str:
    """The span's W3C traceparent, without its flags (the SDK sets more than "sampled")."""
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}"


def parent_of(trace_context: dict[str, str]) -> str:
    """A stored trace context's traceparent, without its flags."""
    return trace_context["traceparent"].rsplit("-", 1)[0]


def stored_contexts(db: psycopg.Connection, schema: str, table: str = "jobs") -> dict[int, Any]:
    rows = db.execute(
        sql.SQL("SELECT id, trace_context FROM {}.{} ORDER BY id").format(
            sql.Identifier(schema), sql.Identifier(table)
        )
    ).fetchall()
    return dict(rows)


def by_kind(spans: InMemorySpanExporter, kind: SpanKind) -> list[Any]:
    return [span for span in spans.get_finished_spans() if span.kind is kind]


def test_without_a_tracer_provider_jobs_carry_no_trace_context(queue: Queue, db, schema):
    assert not tracing.enabled()
    one = queue.enqueue("echo", {"n": 1}).job
    many = [r.job for r in queue.enqueue_many([JobSpec("echo"), JobSpec("echo")])]
    keyed = queue.enqueue("echo", idempotency_key="k-1").job
    assert one.trace_context is None
    assert stored_contexts(db, schema) == {job.id: None for job in [one, *many, keyed]}


def test_a_provider_named_in_the_environment_turns_tracing_on():
    check = "from pgqueue import tracing; print(tracing.enabled())"
    for variables, expected in (({}, "False"), (NAMED_PROVIDER, "True")):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        answer = subprocess.run(
            [sys.executable, "-c", check], env={**env, **variables}, capture_output=True, text=True
        )
        assert answer.stdout.strip() == expected, answer.stderr


def test_without_opentelemetry_installed_pgqueue_runs_untraced(queue: Queue, db, schema):
    # As if opentelemetry-api were not installed: importing it raises ImportError.
    check = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from pgqueue import Queue, tracing\n"
        "import pgqueue_worker\n"
        "assert not tracing.enabled()\n"
        "with Queue.connect(sys.argv[1], schema=sys.argv[2]) as queue:\n"
        "    print(queue.enqueue('echo').job.id)\n"
    )
    answer = subprocess.run(
        [sys.executable, "-c", check, queue.pool.conninfo, schema], capture_output=True, text=True
    )
    assert answer.returncode == 0, answer.stderr
    assert stored_contexts(db, schema) == {int(answer.stdout): None}


def test_enqueue_runs_in_a_producer_span_whose_context_the_job_keeps(
    spans: InMemorySpanExporter, queue: Queue, db, schema
):
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        job = queue.enqueue("echo", {"n": 1}, queue="mail").job
    [producer] = by_kind(spans, SpanKind.PRODUCER)
    assert producer.name == "send mail"
    assert producer.parent.span_id == request.get_span_context().span_id
    assert producer.context.trace_id == request.get_span_context().trace_id
    assert dict(producer.attributes) == {
        "messaging.system": "pgqueue",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "mail",
        "pgqueue.task": "echo",
        "messaging.message.id": str(job.id),
    }
    assert parent_of(stored_contexts(db, schema)[job.id]) == traceparent(producer)
    assert parent_of(queue.get(job.id).trace_context) == traceparent(producer)


def test_a_batch_is_one_producer_span_and_every_job_keeps_its_context(
    spans: InMemorySpanExporter, queue: Queue, db, schema
):
    plain = queue.enqueue_many([JobSpec("echo", queue="a"), JobSpec("echo", queue="b")])
    keyed = queue.enqueue_many([JobSpec("echo", idempotency_key="k-1"), JobSpec("other")])
    first, second = by_kind(spans, SpanKind.PRODUCER)
    assert first.name == "send"  # two queues: no one destination
    assert first.attributes["messaging.batch.message_count"] == 2
    assert "messaging.destination.name" not in first.attributes
    assert second.name == "send default"
    assert "pgqueue.task" not in second.attributes  # two tasks
    stored = stored_contexts(db, schema)
    assert {parent_of(stored[r.job.id]) for r in plain} == {traceparent(first)}
    assert {parent_of(stored[r.job.id]) for r in keyed} == {traceparent(second)}


def test_the_jobs_a_traced_enqueue_returns_carry_the_context_the_table_holds(
    spans: InMemorySpanExporter, queue: Queue
):
    one = queue.enqueue("echo", {"n": 1}).job
    inserted = [r.job for r in queue.enqueue_many([JobSpec("echo"), JobSpec("other")])]
    copied = [r.job for r in queue.enqueue_many(JobSpec("echo") for _ in range(COPY_MIN_JOBS))]
    for job in [one, *inserted, copied[0], copied[-1]]:
        assert job.trace_context is not None
        assert job == queue.get(job.id)


def test_an_enqueue_that_fails_records_it_on_its_span(spans: InMemorySpanExporter, queue: Queue):
    queue.enqueue("echo", {"n": 1}, idempotency_key="same")
    with pytest.raises(Exception, match="idempotency"):
        queue.enqueue("echo", {"n": 2}, idempotency_key="same")
    failed = by_kind(spans, SpanKind.PRODUCER)[-1]
    assert failed.status.status_code is StatusCode.ERROR
    assert [event.name for event in failed.events] == ["exception"]


def test_the_trace_context_moves_with_the_job_between_the_tables(
    spans: InMemorySpanExporter, queue: Queue, db, schema
):
    protocol = WorkerProtocol(queue)
    acked, buried, cancelled, reaped = (
        queue.enqueue("echo", {"n": n}, max_attempts=1).job for n in range(4)
    )
    expected = {
        job.id: job_context(db, schema, job.id) for job in (acked, buried, cancelled, reaped)
    }
    assert all(expected.values())
    claimed = {job.id: job for job in protocol.claim(["default"], ["echo"], limit=2)}
    assert claimed[acked.id].trace_context == expected[acked.id]  # the claim returns it
    protocol.ack(claimed[acked.id], None)
    protocol.fail(claimed[buried.id], "boom")  # dead
    queue.cancel(cancelled.id)
    protocol.claim(["default"], ["echo"], lease_seconds=0.05)
    time.sleep(0.2)
    assert [job.id for job in protocol.reap()] == [reaped.id]  # expired: dead

    assert stored_contexts(db, schema, "finished_jobs") == expected
    assert stored_contexts(db, schema, "active_jobs") == {}
    queue.retry(buried.id)  # back to active_jobs
    assert stored_contexts(db, schema, "active_jobs") == {buried.id: expected[buried.id]}
    assert stored_contexts(db, schema) == expected


def job_context(db: psycopg.Connection, schema: str, job_id: int) -> Any:
    return stored_contexts(db, schema)[job_id]


def test_each_attempt_runs_in_a_consumer_span_of_the_producer_trace(
    spans: InMemorySpanExporter, queue: Queue
):
    inner = trace.get_tracer("handler")

    def ok(payload: dict[str, Any]) -> dict[str, Any]:
        with inner.start_as_current_span("inside the handler"):
            return payload

    def boom(payload: dict[str, Any]) -> None:
        raise ValueError("no luck")

    async def later(payload: dict[str, Any]) -> str:
        return "done"

    good = queue.enqueue("ok", {"n": 1}, queue="mail").job
    bad = queue.enqueue("boom", max_attempts=1, queue="mail").job
    awaited = queue.enqueue("later", queue="mail").job
    worker = Worker(queue, {"ok": ok, "boom": boom, "later": later}, queues=["mail"], burst=True)
    assert worker.run()
    assert queue.get(bad.id).state is JobState.DEAD

    producers = {
        span.attributes["messaging.message.id"]: span for span in by_kind(spans, SpanKind.PRODUCER)
    }
    consumers = {
        span.attributes["messaging.message.id"]: span for span in by_kind(spans, SpanKind.CONSUMER)
    }
    assert set(consumers) == {str(good.id), str(bad.id), str(awaited.id)}
    for job_id, consumer in consumers.items():
        producer = producers[job_id]
        assert consumer.name == "process mail"
        assert consumer.context.trace_id == producer.context.trace_id
        assert consumer.parent.span_id == producer.context.span_id
        assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
        assert consumer.attributes["messaging.system"] == "pgqueue"
        assert consumer.attributes["messaging.operation.type"] == "process"
        assert consumer.attributes["messaging.destination.name"] == "mail"
        assert consumer.attributes["pgqueue.attempt"] == 1
    assert consumers[str(good.id)].status.status_code is StatusCode.UNSET
    failed = consumers[str(bad.id)]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ValueError"
    [event] = failed.events
    assert event.name == "exception"
    assert event.attributes["exception.message"] == "no luck"
    # Spans the handler starts are the attempt's children.
    [handlers_own] = [s for s in spans.get_finished_spans() if s.name == "inside the handler"]
    assert handlers_own.parent.span_id == consumers[str(good.id)].context.span_id


def test_the_api_request_span_is_the_parent_of_the_enqueue(
    spans: InMemorySpanExporter, database_url: str, schema: str, db
):
    app = create_app(ApiSettings(database_url=database_url, schema=schema))
    FastAPIInstrumentor.instrument_app(app)
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    header = {"traceparent": f"00-{client_trace}-00f067aa0ba902b7-01"}
    with serve(app) as url:
        one = httpx.post(f"{url}/jobs", json={"task": "echo"}, headers=header)
        batch = httpx.post(
            f"{url}/jobs/batch", json={"jobs": [{"task": "echo"}] * 2}, headers=header
        )
    assert (one.status_code, batch.status_code) == (201, 201)
    servers = {span.context.span_id: span for span in by_kind(spans, SpanKind.SERVER)}
    producers = by_kind(spans, SpanKind.PRODUCER)
    assert len(producers) == 2
    for producer in producers:
        assert f"{producer.context.trace_id:032x}" == client_trace
        assert producer.parent.span_id in servers
    stored = stored_contexts(db, schema)
    assert json.dumps(stored[one.json()["id"]]).count(client_trace) == 1


def test_an_attempt_called_off_ends_its_span_in_error(spans: InMemorySpanExporter, queue: Queue):
    def slow(job: Any) -> str:
        job.wait_cancelled(30)  # returns once the worker calls the attempt off
        return "too late"

    job = queue.enqueue("slow", timeout_seconds=0.2, max_attempts=1).job
    assert Worker(queue, {"slow": slow}, burst=True).run()
    assert queue.get(job.id).state is JobState.DEAD
    [consumer] = by_kind(spans, SpanKind.CONSUMER)
    assert consumer.status.status_code is StatusCode.ERROR
    assert "called off" in consumer.status.description
    assert consumer.events == ()  # nothing raised


@pytest.mark.parametrize(
    "stored", ['{"traceparent": 1e5000}', '"not an object"'], ids=["undecodable", "not an object"]
)
def test_a_trace_context_that_cannot_be_read_leaves_the_attempt_untraced_by_its_producer(
    spans: InMemorySpanExporter, queue: Queue, db, schema: str, stored: str
):
    """Written by another client or by hand: the job runs in a consumer span of its own
    (no producer to link), as a job enqueued untraced does."""
    job = queue.enqueue("ok", {"n": 1}).job
    db.execute(
        sql.SQL("UPDATE {}.active_jobs SET trace_context = %s WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        (stored, job.id),
    )
    assert Worker(queue, {"ok": lambda payload: payload}, burst=True).run()
    done = queue.get(job.id)
    assert (done.state, done.result) == (JobState.SUCCEEDED, {"n": 1})
    [consumer] = by_kind(spans, SpanKind.CONSUMER)
    assert consumer.links == () and consumer.status.status_code is StatusCode.UNSET
