"""OpenTelemetry tracing: a producer span per enqueue, a consumer span per attempt.

Optional: it needs ``opentelemetry-api`` (``pip install 'pgqueue-core[otel]'``) and a
tracer provider set by the application (the SDK, its exporters and its sampling are
the application's choice). Without either, nothing here runs: each enqueue and each
attempt pays one look-up (:func:`enabled`), and jobs are stored without a trace context.

With a provider set:

- ``Queue.enqueue`` and ``Queue.enqueue_many`` (so the HTTP API's ``POST /jobs`` and
  ``/jobs/batch`` too) run in a ``PRODUCER`` span, a child of the current span (the
  API request's server span, when the API is instrumented), and store the W3C trace
  context of that span with each job (the ``trace_context`` column), as the global
  propagator writes it: ``traceparent`` and ``tracestate`` (and baggage, if configured).
- The worker runs each attempt's handler in a ``CONSUMER`` span whose parent is that
  stored context and which links to it, so one trace runs from the request that
  enqueued a job to every attempt that ran it; spans the handler starts are its
  children. A handler that raises records the exception and sets the error status.

Attributes follow OpenTelemetry's messaging semantic conventions: ``messaging.system``
is ``pgqueue``, the destination is the queue, the message id the job id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.job import Job

from types import ModuleType

_API: ModuleType | None
try:
    from opentelemetry import propagate, trace

    _API = trace
except ImportError:  # the otel extra is not installed: tracing is off
    _API = None

MESSAGING_SYSTEM = "pgqueue"
# The variable through which OpenTelemetry's API loads a tracer provider by name.
_PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"
TRACER_NAME = "pgqueue"

if _API is not None:
    _get_tracer_provider = trace.get_tracer_provider
    # The API's own providers record nothing: the proxy it hands out until an
    # application sets a provider, and the no-op one.
    _INACTIVE = frozenset({trace.ProxyTracerProvider, trace.NoOpTracerProvider})
    _VERSION = metadata.version("pgqueue-core")
    # The tracer of the provider it came from: asked again only when the provider
    # changed (a proxy tracer would keep the first provider's for good).
    _tracers: list[Any] = [None, None]

    if hasattr(trace, "_TRACER_PROVIDER") and _PROVIDER_VARIABLE not in os.environ:

        def enabled() -> bool:
            """True when enqueues and attempts are traced: opentelemetry-api is installed
            and the application has set a tracer provider. Called per enqueue and per
            attempt, so it reads the API's global as it is (get_tracer_provider() would
            look up an environment variable first, costing an enqueue about a
            microsecond)."""
            provider = trace._TRACER_PROVIDER
            return provider is not None and type(provider) not in _INACTIVE

    else:  # a provider named by OTEL_PYTHON_TRACER_PROVIDER, loaded on first use

        def enabled() -> bool:
            """True when enqueues and attempts are traced: opentelemetry-api is installed
            and a tracer provider is set."""
            return type(_get_tracer_provider()) not in _INACTIVE

    def _tracer() -> Any:
        provider = _get_tracer_provider()
        cached_provider, tracer = _tracers
        if cached_provider is not provider:
            tracer = provider.get_tracer(TRACER_NAME, _VERSION)
            _tracers[:] = [provider, tracer]
        return tracer

else:

    def enabled() -> bool:
        """False: opentelemetry-api is not installed."""
        return False


class Sending:
    """The producer span of one enqueue, and the trace context to store with its jobs."""

    def __init__(self, span: Any, trace_context: str | None) -> None:
        self.span = span
        self.trace_context = trace_context
        """The W3C trace context as JSON text (the ``trace_context`` column), or None
        when the span is not sampled and there is nothing to propagate."""

    def created(self, job_ids: Sequence[int]) -> None:
        """Name the job an enqueue of one job created (``messaging.message.id``)."""
        if len(job_ids) == 1:
            self.span.set_attribute("messaging.message.id", str(job_ids[0]))


def loaded_trace_context(text: str | None) -> dict[str, str] | None:
    """A :attr:`Sending.trace_context` as a job read back from the table holds it."""
    return None if text is None else json.loads(text)


@contextmanager
def sending(queues: Sequence[str], tasks: Sequence[str]) -> Iterator[Sending]:
    """A ``PRODUCER`` span around the insert of jobs of ``tasks`` into ``queues`` (one
    item per job), current while it runs; an exception records itself on it."""
    destinations = sorted(set(queues))
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if len(destinations) == 1:
        attributes["messaging.destination.name"] = destinations[0]
    if len(queues) > 1:
        attributes["messaging.batch.message_count"] = len(queues)
    if len(set(tasks)) == 1:
        attributes["pgqueue.task"] = tasks[0]
    # "send <queue>", or "send" for a batch into several queues (the conventions'
    # span name: operation and destination, when there is one destination).
    name = " ".join(["send", *destinations[:1]]) if len(destinations) == 1 else "send"
    with _tracer().start_as_current_span(
        name, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Sending(span, json.dumps(carrier) if carrier else None)


def consume(job: Job, call: Callable[[Job], Any], is_async: bool) -> Any:
    """Call ``call(job)`` (a handler) in the attempt's ``CONSUMER`` span; for an
    ``async def`` handler (``is_async``), return a coroutine that awaits it in the span."""
    if is_async:
        return _consume_async(job, call)
    with _consumer_span(job) as span:
        result = call(job)
        _called_off(job, span)
        return result


async def _consume_async(job: Job, call: Callable[[Job], Any]) -> Any:
    with _consumer_span(job) as span:
        result = await call(job)
        _called_off(job, span)
        return result


def _called_off(job: Job, span: Any) -> None:
    """A handler that returned after its attempt was called off (it overran its time
    limit, the job was cancelled, the lease was lost): its outcome is discarded, which
    the span says, though the handler raised nothing."""
    if job.cancelled:
        span.set_attribute("error.type", "called off")
        span.set_status(
            trace.Status(
                trace.StatusCode.ERROR,
                "the attempt was called off (timed out, cancelled or its lease lost)",
            )
        )


@contextmanager
def _consumer_span(job: Job) -> Iterator[Any]:
    producer = None
    # Anything else than the object pgqueue stores (text Python could not load, or a
    # value another client wrote) names no producer: the attempt is traced on its own.
    if job.trace_context and isinstance(job.trace_context, dict):
        producer = propagate.extract(job.trace_context)
    links = []
    if producer is not None:
        producer_span = trace.get_current_span(producer).get_span_context()
        if producer_span.is_valid:
            links.append(trace.Link(producer_span))
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "pgqueue.task": job.task,
        "pgqueue.attempt": job.attempts,
    }
    # The producer's context is the parent: one trace from the enqueue to each attempt.
    with _tracer().start_as_current_span(
        f"process {job.queue}",
        context=producer,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            # Recorded here, not by the span itself, to add the conventions' error.type.
            span.record_exception(exc, escaped=True)
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
