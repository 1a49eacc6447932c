"""``/metrics``: Prometheus text rendered by ``prometheus_client`` from one database snapshot.

The figures live in PostgreSQL (counted in the table of unfinished jobs, and in the
counters that the statements finishing jobs keep), not in this process, so every API process serves the same numbers and a restart loses none.
A custom collector reads them once per scrape; a private registry keeps this process's
own default metrics out, as they would differ between API processes behind one address.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pgqueue import JobState, Queue
from pgqueue.queue_metrics import MetricsSnapshot

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
        snapshot = self.queue.metrics_snapshot()
        throttled = self.queue.throttled_partitions()
        return iter([*families(snapshot), throttled_partitions(snapshot, throttled)])


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
        "pgqueue_unserved_jobs",
        "Queued jobs whose task no live worker (in the worker registry) serves in their "
        "queue. By queue and task; only pairs with such jobs appear.",
        labels=["queue", "task"],
    )
    for entry in snapshot.unserved:
        unserved.add_metric([entry.queue, entry.task], entry.jobs)
    workers = GaugeMetricFamily(
        "pgqueue_workers",
        "Live workers (in the worker registry) serving each queue.",
        labels=["queue"],
    )
    for queue_name, count in sorted(snapshot.workers.items()):
        workers.add_metric([queue_name], count)
    oldest = GaugeMetricFamily(
        "pgqueue_queue_oldest_runnable_age_seconds",
        "How long the oldest job that could run now has waited, by queue (0 when none waits).",
        labels=["queue"],
    )
    for queue in snapshot.queues:
        oldest.add_metric([queue.queue], queue.oldest_runnable_age_seconds or 0.0)
    run_seconds = HistogramMetricFamily(
        "pgqueue_job_run_seconds",
        "How long succeeded attempts ran, from claim to ack on the database clock, by "
        "queue and task; counted by the ack statement, so every attempt of every worker.",
        labels=["queue", "task"],
    )
    for histogram in snapshot.run_times:
        run_seconds.add_metric(
            [histogram.queue, histogram.task],
            buckets=_cumulative(histogram.bounds, histogram.counts),
            sum_value=histogram.seconds,
        )
    pickup_seconds = HistogramMetricFamily(
        "pgqueue_enqueue_to_start_seconds",
        "How long attempts waited to start, by queue: from when the job became runnable "
        "(the later of its enqueue and its run_at, which a retry moves) to its claim, on "
        "the database clock; one observation per attempt started, by every worker.",
        labels=["queue"],
    )
    for pickup in snapshot.pickup_times:
        pickup_seconds.add_metric(
            [pickup.queue],
            buckets=_cumulative(pickup.bounds, pickup.counts),
            sum_value=pickup.seconds,
        )
    for queue in snapshot.queues:
        for state in JobState:
            jobs.add_metric([queue.queue, state.value], queue.jobs[state.value])
        completed.add_metric([queue.queue], queue.completed)
        failures.add_metric([queue.queue], queue.failures)
    return [jobs, completed, failures, unserved, oldest, run_seconds, pickup_seconds, workers]


def throttled_partitions(snapshot: MetricsSnapshot, throttled: dict[str, int]) -> Metric:
    """``pgqueue_throttled_partitions{queue}``: per queue, its partition keys throttled
    now (0 for every queue of the snapshot that has none, so a dashboard can tell "none"
    from "not scraped")."""
    gauge = GaugeMetricFamily(
        "pgqueue_throttled_partitions",
        "Partition keys throttled now (by a handler's Throttle or an operator), by queue.",
        labels=["queue"],
    )
    counts = {queue.queue: 0 for queue in snapshot.queues} | throttled
    for queue_name, count in sorted(counts.items()):
        gauge.add_metric([queue_name], count)
    return gauge


def _cumulative(bounds: list[float], counts: list[int]) -> list[tuple[str, float]]:
    """A histogram's buckets as Prometheus writes them: each bound's ``le`` label with
    the observations at or below it."""
    return list(zip([floatToGoString(bound) for bound in bounds], accumulate(counts), strict=True))


class ScheduleCollector(Collector):
    """``pgqueue_schedule_last_run_timestamp_seconds{schedule}``: when each schedule's
    last job was enqueued, from the small schedules table (one short query a scrape)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        last_run = GaugeMetricFamily(
            "pgqueue_schedule_last_run_timestamp_seconds",
            "When each schedule's last job was enqueued (Unix time, database clock); only "
            "schedules that ran appear.",
            labels=["schedule"],
        )
        for name, seconds in self.queue.schedule_last_runs().items():
            last_run.add_metric([name], seconds)
        yield last_run


def metrics_registry(queue: Queue) -> CollectorRegistry:
    """A registry holding only pgqueue's collectors for ``queue``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(queue))
    registry.register(ScheduleCollector(queue))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry's metrics as Prometheus text (one database snapshot)."""
    return generate_latest(registry)
