"""``/metrics``: Prometheus text rendered by ``prometheus_client`` from one database snapshot.

The figures live in PostgreSQL (counted in the table of unfinished jobs, and in the
counters that the statements finishing jobs keep), not in this process, so every API process serves the same numbers and a restart loses none.
A custom collector reads them once per scrape; a private registry keeps this process's
own default metrics out, as they would differ between API processes behind one address.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pgqueue import JobState, Queue
from pgqueue.queue import UNSERVED_AFTER_SECONDS, MetricsSnapshot

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The Prometheus text exposition format that ``generate_latest`` writes."""


class QueueCollector(Collector):
    """Collects pgqueue's metrics from one :meth:`Queue.metrics_snapshot` per scrape."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def describe(self) -> list[Metric]:
        # Registering must not query the database, so the names are not described ahead.
        return []

    def collect(self) -> Iterator[Metric]:
        return iter(families(self.queue.metrics_snapshot()))


def families(snapshot: MetricsSnapshot) -> list[Metric]:
    """The metric families for one snapshot."""
    jobs = GaugeMetricFamily(
        "pgqueue_jobs", "Jobs in the table, by queue and state.", labels=["queue", "state"]
    )
    completed = CounterMetricFamily(
        "pgqueue_jobs_completed", "Attempts that succeeded, by queue.", labels=["queue"]
    )
    failures = CounterMetricFamily(
        "pgqueue_job_failures",
        "Attempts that failed or whose lease expired, by queue.",
        labels=["queue"],
    )
    unserved = GaugeMetricFamily(
        "pgqueue_jobs_unserved",
        f"Queued jobs runnable for over {UNSERVED_AFTER_SECONDS:g} s while no job of their "
        "queue and task was running: most likely no running worker serves their task in "
        "their queue. By queue and task; only pairs with such jobs appear.",
        labels=["queue", "task"],
    )
    for entry in snapshot.unserved:
        unserved.add_metric([entry.queue, entry.task], entry.jobs)
    for queue in snapshot.queues:
        for state in JobState:
            jobs.add_metric([queue.queue, state.value], queue.jobs[state.value])
        completed.add_metric([queue.queue], queue.completed)
        failures.add_metric([queue.queue], queue.failures)
    return [jobs, completed, failures, unserved]


def metrics_registry(queue: Queue) -> CollectorRegistry:
    """A registry holding only pgqueue's collector for ``queue``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(queue))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry's metrics as Prometheus text (one database snapshot)."""
    return generate_latest(registry)
