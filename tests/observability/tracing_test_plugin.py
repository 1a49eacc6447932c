"""Loaded with ``pgqueue worker --plugin tracing_test_plugin``: sets up the OpenTelemetry
SDK in the worker process, as an application would, exporting every finished span as
one JSON line to the file named by ``PGQUEUE_TEST_SPAN_FILE``. It has no hooks."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

_out = open(os.environ["PGQUEUE_TEST_SPAN_FILE"], "a", buffering=1)  # noqa: SIM115 (the process's)
_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(out=_out, formatter=lambda span: span.to_json(indent=None) + "\n")
    )
)
trace.set_tracer_provider(_provider)
