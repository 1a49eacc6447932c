"""The scale driver's measurements on one schema: a drain (claim+ack throughput, claim
latency, CPU per job, where the new jobs were written), ``/metrics`` scrapes and
``Queue.stats()`` calls through the real API app, and pruning the oldest day of
history through pgqueue's retention path.

A drain deletes its jobs again and vacuums, so the tables and counters are what they
were before it and the next run starts alike; pruning is the last thing done to a
history.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from pgqueue import JobSpec, Queue
from pgqueue.history import Day
from pgqueue.job import FINISHED_STATES
from pgqueue_bench import handlers
from pgqueue_bench.infra import database
from pgqueue_bench.infra.server_cpu import ServerCpu
from pgqueue_bench.infra.servers import free_port
from pgqueue_bench.scenarios.latency import percentiles
from pgqueue_bench.scenarios.scale.clients import (
    claim_latency_ms,
    client_processes,
    collect_reports,
)
from pgqueue_bench.scenarios.scale.history import (
    HistoryWindow,
    jobs_activity,
    relation_sizes,
    settled_activity,
)
from pgqueue_bench.scenarios.scale.scenario import ENQUEUE_BATCH, QUEUE_NAME, Scenario
from pgqueue_bench.scenarios.scale.statements import run_statement

# -- one throughput run ---------------------------------------------------------------


def enqueue_measured(url: str, schema: str, jobs: int) -> None:
    """``jobs`` runnable no-op jobs in the measured queue, through ``enqueue_many``."""
    with Queue.connect(url, schema=schema, max_size=1) as queue:
        for start in range(0, jobs, ENQUEUE_BATCH):
            count = min(ENQUEUE_BATCH, jobs - start)
            queue.enqueue_many(
                [
                    JobSpec(handlers.NOOP_TASK, {"seq": start + i}, queue=QUEUE_NAME)
                    for i in range(count)
                ]
            )


def vacuum_jobs(url: str, schema: str) -> None:
    """VACUUM both job tables between runs (and ANALYZE the hot one), so that each run
    starts from tables without dead rows."""
    run_statement(url, "active_jobs_vacuum", schema)
    run_statement(url, "finished_jobs_vacuum", schema)


def measure_drain(
    url: str, schema: str, scenario: Scenario, server_cpu: ServerCpu | None = None
) -> dict[str, Any]:
    """Enqueue ``scenario.jobs`` jobs, let the clients claim and ack them all (the acks
    move them to finished_jobs), then delete them again, so the tables and counters are
    what they were before. ``server_cpu`` reads the server's CPU seconds (private
    clusters only), for the server's CPU time per job."""
    last_id = run_statement(url, "job_ids_last", schema)[0]["last_id"]
    enqueue_measured(url, schema, scenario.jobs)
    vacuum_jobs(url, schema)
    placement = run_statement(url, "measured_jobs_pages", schema, {"after_id": last_id})[0]
    activity_before = jobs_activity(url, schema)
    cpu_before = server_cpu() if server_cpu else None
    with client_processes(url, schema, scenario.clients, scenario.batch) as (
        ready,
        reports,
        _,
        procs,
    ):
        ready.wait(timeout=300)
        reports_list = collect_reports(reports, procs, scenario.timeout)
    cpu_after = server_cpu() if server_cpu else None
    activity_after = jobs_activity(url, schema)
    run_statement(url, "measured_jobs_delete", schema, {"after_id": last_id})
    vacuum_jobs(url, schema)
    acked = sum(report["acked"] for report in reports_list)
    seconds = max(r["finished"] for r in reports_list) - min(r["started"] for r in reports_list)
    latencies = [value for report in reports_list for value in report["claim_latencies"]]

    def autovacuums(table: str) -> int:
        return (activity_after[table].get("autovacuum_count") or 0) - (
            activity_before[table].get("autovacuum_count") or 0
        )

    return {
        "jobs": scenario.jobs,
        "acked": acked,
        "verified": acked == scenario.jobs,
        "seconds": seconds,
        "jobs_per_second": acked / seconds if seconds else None,
        "claims": len(latencies),
        "heap_pages_of_measured_jobs": placement["pages"],
        "server_cpu_us_per_job": (cpu_after - cpu_before) / acked * 1e6
        if cpu_before is not None and cpu_after is not None and acked
        else None,
        "client_cpu_us_per_job": sum(r["cpu_seconds"] for r in reports_list) / acked * 1e6
        if acked
        else None,
        "claim_latency_ms": claim_latency_ms(latencies),
        "autovacuums_during_run": autovacuums("active_jobs"),
        "finished_autovacuums_during_run": autovacuums("finished_jobs"),
    }


# -- /metrics through the real app ----------------------------------------------------


@contextlib.contextmanager
def metrics_endpoint(url: str, schema: str) -> Iterator[tuple[str, Queue]]:
    """The real API app on this schema, served by uvicorn on a loopback port; yields
    the ``/metrics`` URL and the app's Queue."""
    import uvicorn

    from pgqueue_api.app import create_app
    from pgqueue_api.settings import ApiSettings

    # The app warns that it has no tokens; on loopback, for a benchmark, that is intended.
    logging.getLogger("pgqueue.api").setLevel(logging.ERROR)
    queue = Queue.connect(url, schema=schema, min_size=1, max_size=2)
    settings = ApiSettings(database_url=url, schema=schema, public_metrics=True)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, queue=queue),
            host="127.0.0.1",
            port=port,
            log_config=None,
            log_level="warning",
            access_log=False,
        )
    )
    thread = threading.Thread(target=server.run, name="pgqueue-scale-api", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the API app did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/metrics", queue
    finally:
        server.should_exit = True
        thread.join(10)
        queue.close()


def measure_scrapes(url: str, schema: str, scrapes: int) -> dict[str, Any]:
    """``scrapes`` GETs of ``/metrics`` and as many ``Queue.stats()`` calls, timed."""
    with metrics_endpoint(url, schema) as (metrics_url, queue):
        for _ in range(5):  # warm: connections open, statements planned
            urllib.request.urlopen(metrics_url, timeout=30).read()
        scrape_ms = []
        body = b""
        for _ in range(scrapes):
            before = time.perf_counter()
            with urllib.request.urlopen(metrics_url, timeout=30) as response:
                body = response.read()
            scrape_ms.append((time.perf_counter() - before) * 1000)
        stats_ms = []
        for _ in range(scrapes):
            before = time.perf_counter()
            queue.stats()
            stats_ms.append((time.perf_counter() - before) * 1000)
    return {
        "scrapes": scrapes,
        "metrics_ms": percentiles(scrape_ms),
        "metrics_bytes": len(body),
        "status_ms": percentiles(stats_ms),
    }


# -- pruning a day --------------------------------------------------------------------


def measure_prune(
    url: str, schema: str, window: HistoryWindow, history_rows: int
) -> dict[str, Any]:
    """Drop the oldest day of the history through pgqueue's retention path,
    ``Queue.prune_expired``, as a worker's pruner would, and report what went, how long
    it took, and what it did to the tables: the day's partitions go whole, so
    active_jobs, the hot table, must gain no dead tuple and see no row deleted or
    updated. Checks the jobs removed against a count made before, and the queue
    counters' fall against the jobs removed."""
    oldest = window.days()[0]
    oldest_end = Day(FINISHED_STATES[0], oldest).end
    # A day goes once its end is older than the retention: half a day short of the
    # oldest day's age, that day has expired and the next (which ends a day later) has
    # not, however long the call takes.
    retention = database.database_now(url) - oldest_end - timedelta(hours=12)
    expected = run_statement(url, "finished_jobs_before", schema, {"before": oldest_end})[0]["jobs"]
    storage_before = relation_sizes(url, schema)
    with Queue.connect(url, schema=schema, min_size=1, max_size=1) as queue:
        counted_before = _finished_count(queue)
        activity_before = settled_activity(url, schema)
        began = time.perf_counter()
        removed = queue.prune_expired({state: retention for state in FINISHED_STATES})
        seconds = time.perf_counter() - began
        counted_after = _finished_count(queue)
    # The pruning sessions have ended (the pool is closed), so their statistics are out.
    activity_after = settled_activity(url, schema)
    storage_after = relation_sizes(url, schema)

    def grew(table: str, *keys: str) -> int:
        return sum(
            (activity_after[table].get(key) or 0) - (activity_before[table].get(key) or 0)
            for key in keys
        )

    dead_added = grew("active_jobs", "n_dead_tup")
    written = grew("active_jobs", "n_tup_del", "n_tup_upd")
    return {
        "history_rows": history_rows,
        "day": oldest.isoformat(),
        "retention_seconds": retention.total_seconds(),
        "expected_jobs": expected,
        "jobs_removed": removed,
        "counters_fell_by": counted_before - counted_after,
        "verified": removed == expected and counted_before - counted_after == expected,
        "seconds": seconds,
        "jobs_per_second": removed / seconds if removed and seconds else None,
        "finished_partitions_before": storage_before["finished_partitions"],
        "finished_partitions_after": storage_after["finished_partitions"],
        "finished_bytes_freed": storage_before["finished_table_bytes"]
        + storage_before["finished_index_bytes"]
        - storage_after["finished_table_bytes"]
        - storage_after["finished_index_bytes"],
        "active_jobs_before": activity_before["active_jobs"],
        "active_jobs_after": activity_after["active_jobs"],
        "active_dead_tuples_added": dead_added,
        "active_rows_deleted_or_updated": written,
        # Dropped partitions take their statistics with them: this sums the days left.
        "finished_dead_tuples_added": grew("finished_jobs", "n_dead_tup"),
        "met": dead_added <= 0 and written == 0,
    }


def _finished_count(queue: Queue) -> int:
    """Finished jobs of every queue, as stats and /metrics count them (the counters)."""
    return sum(stats.counts[state.value] for stats in queue.stats() for state in FINISHED_STATES)
