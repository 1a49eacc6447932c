"""Fixtures for the observability tests: an OpenTelemetry SDK whose spans stay in memory,
set as this process's tracer provider for one test and taken away after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _forget_tracer_provider() -> None:
    """Back to no tracer provider, as OpenTelemetry's own test utilities do: the API
    lets a process set one only once, and the other tests run without one."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The finished spans of this test, recorded by the SDK's in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _forget_tracer_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        _forget_tracer_provider()
        provider.shutdown()
