"""The scale driver: does a job cost the same with months of history kept?

Three measurements, written to ``results/scale.json`` with a chart in
``results/scale.png`` and ``results/scale-soak.png``.

**History sizes.** A ``history`` schema is filled, step by step, with 0, 100k, 1M and
5M finished jobs (succeeded, dead and cancelled, as a month of traffic leaves them),
loaded with COPY into ``finished_jobs``, each job into its state's partition for the
UTC day it finished (the days are created first, as pgqueue's pruner creates them),
added to the queue counters as the finishing statements would have, and then frozen by
VACUUM as autovacuum would long since have done. The history spans the 30 whole days
before the day of the first load and that day up to the load. At each size the driver
measures, on that schema and on a ``baseline`` schema that holds no history:

- claim+ack throughput: ``--jobs`` no-op jobs are enqueued, then ``--clients``
  processes claim ``--batch`` jobs per statement and ack them (``Queue.claim`` then
  ``Queue.ack_many``, two transactions) until none is left; the rate is the jobs over
  the time from the first claim to the last ack;
- claim latency: every ``Queue.claim`` call, timed in the client (round trip included);
- ``/metrics`` scrape time: GETs to the real API app (``pgqueue_api.app.create_app``)
  served by uvicorn on loopback, and the time of ``Queue.stats()`` (``pgqueue status``);
- table, partition and index sizes, from the catalogs: ``active_jobs`` (the hot table
  that claims, acks and heartbeats touch) apart from ``finished_jobs``;
- server CPU per job: the CPU seconds the private cluster's processes used during the
  run over the jobs, which other programs on the machine barely move;
- where the new jobs were written: how many heap pages of ``active_jobs`` hold them.

The two schemas are measured back to back within each repeat, so a machine that gets
busier slows both alike; the target (at least 95% of the throughput without history)
is judged on the median over repeats of the history run's throughput over the
baseline's at the largest size (also given: over the history schema's own empty-table
figure, measured earlier).

**Pruning a day.** With the largest history loaded, the real retention path,
``Queue.prune_expired``, runs with a retention under which exactly the oldest day of
history has expired: it drops that day's partitions. The driver reports the jobs that
went, the time it took, and ``active_jobs``' dead tuples, deletes and updates before
and after, which pruning must not raise (the target), and checks that the queue
counters fell by the jobs removed.

**Soak.** A producer keeps a backlog of no-op jobs while ``--clients`` processes claim
and ack as fast as they can for ``--soak-seconds``. In the middle half of the run a
REPEATABLE READ transaction that holds an xid stays open and holds back the xmin horizon,
as a forgotten ``BEGIN``, a long report or a long backup would: no row version that
dies meanwhile can be removed. The driver reports throughput, claim latency, dead
tuples of ``active_jobs`` and the claim index's size per window, and per phase
(before, during, after).

By default everything runs on a private cluster of the same PostgreSQL version as
``DATABASE_URL`` (or the embedded one), at PostgreSQL's default settings, so loading
gigabytes of history never touches a shared server; ``--database-url`` runs on a given
server instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import re
import statistics
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import click
import psutil
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue import JobSpec, Queue, migrate
from pgqueue.history import Day
from pgqueue.job import FINISHED_STATES
from pgqueue_bench import database, environment, handlers, results
from pgqueue_bench.latency import percentiles
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.servers import PrivateServer, binaries_for, free_port

QUEUE_NAME = "scale"
OTHER_QUEUES = ("emails", "reports")
# Whole days of history before the day of the first load (which holds the rest).
HISTORY_DAYS = 30
COPY_CHUNK_ROWS = 200_000
ENQUEUE_BATCH = 5_000

SIZES = (0, 100_000, 1_000_000, 5_000_000)
QUICK_SIZES = (0, 100_000)

# PostgreSQL's defaults, except room for the clients: the figures should be what an
# untuned server gives.
PRIVATE_SERVER_SETTINGS = {"max_connections": "100", "shared_buffers": "128MB"}

# The target: with the largest history, at least 95% of the throughput without history.
THROUGHPUT_TOLERANCE = 0.05
METRICS_BUDGET_MS = 50.0
# Runnable jobs the soak's producer keeps queued, so the clients never run dry.
SOAK_BACKLOG = 5_000


# -- statements ---------------------------------------------------------------------

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def _statements() -> dict[str, str]:
    text = resources.files("pgqueue_bench.sql").joinpath("scale.sql").read_text()
    parts = _NAME_LINE.split(text)
    bodies = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        bodies[name] = "\n".join(lines).strip().rstrip(";")
    return bodies


def statement(name: str, schema: str) -> sql.Composed:
    """The statement called ``name`` in ``scale.sql``, for the tables of ``schema``."""
    return sql.SQL(_statements()[name]).format(schema=sql.Identifier(schema))


def _rows(url: str, name: str, schema: str, params: dict[str, Any] | None = None) -> list[dict]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(statement(name, schema), params)
        return cur.fetchall() if cur.description else []


# -- history ------------------------------------------------------------------------


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(sep=" ")


@dataclass(frozen=True)
class HistoryWindow:
    """When a history's jobs finished: evenly spread from ``start``, midnight UTC
    HISTORY_DAYS whole days before the day of ``end``, to ``end``; job ``n`` of
    ``total`` at ``start + n * step``. Fixed once per schema, so that every load of
    the same history spreads its jobs alike."""

    start: float
    end: float
    total: int

    @classmethod
    def ending(cls, end: float, total: int) -> HistoryWindow:
        """The window of a ``total``-job history ending at ``end`` (Unix time)."""
        first = datetime.fromtimestamp(end, UTC).date() - timedelta(days=HISTORY_DAYS)
        midnight = datetime(first.year, first.month, first.day, tzinfo=UTC)
        return cls(start=midnight.timestamp(), end=end, total=total)

    @property
    def step(self) -> float:
        return (self.end - self.start) / max(self.total, 1)

    def days(self) -> list[date]:
        """The UTC days the history's jobs finished on, oldest first."""
        first = datetime.fromtimestamp(self.start, UTC).date()
        last = datetime.fromtimestamp(self.end, UTC).date()
        return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def history_lines(first: int, count: int, *, first_id: int, start: float, step: float) -> str:
    """``count`` finished jobs in COPY text format, numbered from ``first``, with ids
    from ``first_id``: 94% succeeded, 4% dead after five attempts, 2% cancelled while
    queued; 70% in the measured queue, the rest in two others. Job ``n`` finished at
    ``start + n * step``."""
    lines = []
    for n in range(first, first + count):
        job_id = first_id + n - first
        finished = start + n * step
        finished_at = _timestamp(finished)
        enqueued_at = _timestamp(finished - 2.0)
        kind = n % 10
        queue = QUEUE_NAME if kind < 7 else OTHER_QUEUES[kind % 2]
        task = handlers.NOOP_TASK if queue == QUEUE_NAME else f"{queue}_task"
        payload = f'{{"n": {n}, "account": "acct-{n % 100_000:05d}"}}'
        worker = f"host-{n % 8}:{1000 + n % 5000}:{n % 65536:08x}"
        fate = n % 50
        if fate < 2:  # dead
            row = (
                f"{job_id}\t{queue}\t{task}\t{payload}\t0\tdead\t{enqueued_at}\t5\t5\t"
                f"{worker}\t{enqueued_at}\t{finished_at}\t{finished_at}\t"
                "RuntimeError: upstream answered 503\t\\N"
            )
        elif fate == 2:  # cancelled before it ran
            row = (
                f"{job_id}\t{queue}\t{task}\t{payload}\t0\tcancelled\t{enqueued_at}\t0\t5\t"
                f"\\N\t{enqueued_at}\t\\N\t{finished_at}\t\\N\t\\N"
            )
        else:
            row = (
                f"{job_id}\t{queue}\t{task}\t{payload}\t0\tsucceeded\t{enqueued_at}\t1\t5\t"
                f"{worker}\t{enqueued_at}\t{_timestamp(finished - 0.05)}\t{finished_at}\t"
                '\\N\t{"ok": true}'
            )
        lines.append(row)
    return "\n".join(lines) + "\n"


def create_history_days(url: str, schema: str, window: HistoryWindow) -> int:
    """Create every finished state's partition for each day of ``window`` that does not
    exist yet, with pgqueue's own statement, as its pruner creates the coming days;
    without them the history would land in the DEFAULT partitions. Returns how many
    day partitions the window covers."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        for each in window.days():
            for state in FINISHED_STATES:
                Day(state, each).create(conn, schema)
    return len(window.days()) * len(FINISHED_STATES)


def load_history(
    url: str,
    schema: str,
    first: int,
    count: int,
    *,
    window: HistoryWindow,
    progress: LiveLine,
) -> dict[str, Any]:
    """COPY jobs ``first`` .. ``first + count - 1`` of the history spread over
    ``window`` into their day partitions, one committed COPY per chunk, with a block of
    ids taken from the job id sequence; add them to the queue counters; then VACUUM
    (FREEZE, ANALYZE). Returns the load's timings."""
    partitions = create_history_days(url, schema, window)
    began = time.monotonic()
    with psycopg.connect(url, connect_timeout=10) as conn:
        first_id = conn.execute(
            statement("history_ids_reserve", schema), {"count": count}
        ).fetchone()[0]  # type: ignore[index]
        conn.commit()
        for offset in range(first, first + count, COPY_CHUNK_ROWS):
            rows = min(COPY_CHUNK_ROWS, first + count - offset)
            lines = history_lines(
                offset,
                rows,
                first_id=first_id + offset - first,
                start=window.start,
                step=window.step,
            )
            with conn.cursor() as cur, cur.copy(statement("history_copy", schema)) as copy:
                copy.write(lines)
            conn.commit()
            progress.update(f"loading history: {offset + rows - first:,}/{count:,} rows")
        copied = time.monotonic() - began
        progress.update(f"counting history: {count:,} rows")
        conn.execute(
            statement("history_count", schema),
            {"first_id": first_id, "last_id": first_id + count - 1},
        )
        conn.commit()
    counted = time.monotonic() - began - copied
    _rows(url, "history_vacuum_freeze", schema)
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        _rows(url, "checkpoint", schema)
    return {
        "rows": count,
        "first_id": first_id,
        "day_partitions": partitions,
        "copy_seconds": copied,
        "rows_per_second": count / copied if copied else None,
        "count_seconds": counted,
        "vacuum_freeze_seconds": time.monotonic() - began - copied - counted,
    }


def relation_sizes(url: str, schema: str) -> dict[str, Any]:
    """Bytes of every table, partition and index of the schema (a TOAST table under
    its table's name and " (toast)"), and the sums the charts show: active_jobs (the hot
    table) with its TOAST table, every partition of finished_jobs with theirs, every
    index, the indexes of each of the two, and the claim index."""
    rows = _rows(url, "relation_sizes", schema, {"schema": schema})
    sizes: dict[str, int] = {}
    for row in rows:
        sizes[row["name"]] = row["bytes"]
        if row["toast_bytes"]:
            sizes[f"{row['name']} (toast)"] = row["toast_bytes"]

    def tables(of: str) -> list[dict[str, Any]]:
        return [row for row in rows if row["of_table"] == of and row["kind"] == "table"]

    def index_bytes(of: str | None = None) -> int:
        return sum(
            row["bytes"]
            for row in rows
            if row["kind"] == "index" and (of is None or row["of_table"] == of)
        )

    return {
        "relations": sizes,
        "active_table_bytes": sum(r["bytes"] + r["toast_bytes"] for r in tables("active_jobs")),
        "finished_table_bytes": sum(r["bytes"] + r["toast_bytes"] for r in tables("finished_jobs")),
        "finished_partitions": len(tables("finished_jobs")),
        "index_bytes": index_bytes(),
        "active_index_bytes": index_bytes("active_jobs"),
        "finished_index_bytes": index_bytes("finished_jobs"),
        "claim_index_bytes": sizes.get("active_jobs_claim_idx", 0),
    }


JOB_TABLES = ("active_jobs", "finished_jobs")


def jobs_activity(url: str, schema: str) -> dict[str, dict[str, Any]]:
    """Cumulative statistics (dead tuples, deletes, autovacuum runs, ...) of
    active_jobs and, summed over its partitions, of finished_jobs, by table name; an
    empty dict for a table the server has no statistics of yet."""
    rows = _rows(url, "jobs_activity", schema, {"schema": schema})
    found = {row.pop("jobs_table"): row for row in rows}
    return {table: found.get(table, {}) for table in JOB_TABLES}


def settled_activity(url: str, schema: str, *, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
    """``jobs_activity`` once the server has published the work done so far: sessions
    report their statistics up to a second after it, or when they end, so read until
    two readings half a second apart agree."""
    reading = jobs_activity(url, schema)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = jobs_activity(url, schema)
        if again == reading:
            break
        reading = again
    return reading


# -- claim and ack clients (child processes) -----------------------------------------


def _summary_ms(latencies: list[float]) -> dict[str, float]:
    return percentiles([seconds * 1000 for seconds in latencies]) if latencies else {}


def drain_client(
    url: str, schema: str, batch: int, ready: Any, results_queue: Any, stop_at: Any | None
) -> None:
    """Claim ``batch`` jobs, ack them, repeat: until none is left (``stop_at`` None), or
    until the wall clock reaches ``stop_at.value`` (a shared double that the driver sets
    once every process is ready). Puts a report on ``results_queue``: the first claim
    and last ack (wall clock), jobs acked, and claim latencies, overall or per second."""
    queue = Queue.connect(url, schema=schema, min_size=1, max_size=1)
    tasks = [handlers.NOOP_TASK]
    claims: list[float] = []
    per_second: dict[int, list[float]] = {}
    acked_per_second: dict[int, int] = {}
    acked = 0
    empty_claims = 0
    try:
        queue.next_run_in([QUEUE_NAME], tasks)  # connected before the clock starts
        ready.wait()
        deadline = _deadline(stop_at)
        started = time.time()
        cpu_started = time.process_time()
        while True:
            before = time.perf_counter()
            jobs = queue.claim([QUEUE_NAME], tasks, batch)
            claim_seconds = time.perf_counter() - before
            now = time.time()
            if deadline is None:
                claims.append(claim_seconds)
                if not jobs:
                    break
            else:
                per_second.setdefault(int(now), []).append(claim_seconds)
                if not jobs:
                    if now >= deadline:
                        break
                    empty_claims += 1
                    time.sleep(0.005)  # the producer is behind: do not spin
                    continue
            queue.ack_many([(job, None) for job in jobs])
            acked += len(jobs)
            if deadline is not None:
                second = int(time.time())
                acked_per_second[second] = acked_per_second.get(second, 0) + len(jobs)
                if time.time() >= deadline:
                    break
        finished = time.time()
        cpu_seconds = time.process_time() - cpu_started
    finally:
        queue.close()
    results_queue.put(
        {
            "started": started,
            "cpu_seconds": cpu_seconds,
            "finished": finished,
            "acked": acked,
            "empty_claims": empty_claims,
            "claim_latencies": claims,
            "per_second": {
                second: {"acked": acked_per_second.get(second, 0), "claim_latencies": values}
                for second, values in per_second.items()
            },
        }
    )


def _deadline(stop_at: Any | None) -> float | None:
    """The shared stop time, once the driver has set it (None: run until drained)."""
    if stop_at is None:
        return None
    while stop_at.value == 0.0:
        time.sleep(0.001)
    return stop_at.value


def backlog_producer(url: str, schema: str, backlog: int, ready: Any, stop_at: Any) -> None:
    """Keep at least ``backlog`` runnable jobs queued until ``stop_at.value`` (wall
    clock), reading the queued count as /metrics does, from active_jobs, which holds no
    history, so the reading costs the same however much history is kept."""
    queue = Queue.connect(url, schema=schema, min_size=1, max_size=1)
    chunk = max(1000, backlog // 2)
    try:
        ready.wait()
        deadline = _deadline(stop_at)
        while time.time() < deadline:
            queued = sum(m.jobs["queued"] for m in queue.metrics_snapshot().queues)
            if queued < backlog:
                specs = [JobSpec(handlers.NOOP_TASK, {"soak": True}, queue=QUEUE_NAME)] * chunk
                queue.enqueue_many(specs)
            else:
                time.sleep(0.02)
    finally:
        queue.close()


@contextlib.contextmanager
def client_processes(
    url: str, schema: str, clients: int, batch: int, *, soak: bool = False
) -> Iterator[tuple[Any, Any, Any, list[Any]]]:
    """Start ``clients`` claim clients (spawned, so each has its own interpreter) and,
    for a soak, the backlog producer. All wait on the returned barrier, which the
    driver passes too; for a soak the driver then sets the shared stop time. Yields
    (barrier, report queue, stop time or None, client processes)."""
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(clients + (2 if soak else 1))
    reports = context.Queue()
    stop_at = context.Value("d", 0.0) if soak else None
    processes = [
        context.Process(
            target=drain_client,
            args=(url, schema, batch, ready, reports, stop_at),
            name=f"pgqueue-scale-client-{index}",
        )
        for index in range(clients)
    ]
    others = []
    if soak:
        others.append(
            context.Process(
                target=backlog_producer,
                args=(url, schema, SOAK_BACKLOG, ready, stop_at),
                name="pgqueue-scale-producer",
            )
        )
    for process in [*processes, *others]:
        process.start()
    try:
        yield ready, reports, stop_at, processes
    finally:
        if stop_at is not None and stop_at.value == 0.0:
            stop_at.value = time.time()  # failed before the start: let everyone go
        for process in [*processes, *others]:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join()


def _collect(reports: Any, processes: list[Any], timeout: float) -> list[dict[str, Any]]:
    collected = []
    deadline = time.monotonic() + timeout
    while len(collected) < len(processes):
        try:
            collected.append(reports.get(timeout=1.0))
        except Exception:  # queue.Empty, from another process's queue module
            if time.monotonic() > deadline:
                raise TimeoutError("the claim clients did not finish in time") from None
            if all(not process.is_alive() for process in processes) and reports.empty():
                raise RuntimeError("a claim client exited without a report") from None
    return collected


# -- one throughput run ---------------------------------------------------------------


ServerCpu = Callable[[], float]


def postgres_cpu_seconds(postmaster_pid: int) -> float:
    """CPU seconds used so far by a PostgreSQL server: the postmaster, its live children
    (backends, autovacuum, checkpointer, WAL writer) and the children that have exited,
    whose time the kernel adds to the postmaster's once it has reaped them. Unlike a
    rate, it barely moves when other programs busy the machine."""
    postmaster = psutil.Process(postmaster_pid)
    own = postmaster.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    for child in postmaster.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            total += times.user + times.system
    return total


@dataclass(frozen=True)
class Scenario:
    """The shape of the scale runs."""

    sizes: tuple[int, ...] = SIZES
    jobs: int = 20_000
    clients: int = 2
    batch: int = 10
    repeats: int = 5
    scrapes: int = 200
    soak_seconds: float = 600.0
    soak_window: float = 10.0
    timeout: float = 1800.0


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
    _rows(url, "active_jobs_vacuum", schema)
    _rows(url, "finished_jobs_vacuum", schema)


def measure_drain(
    url: str, schema: str, scenario: Scenario, server_cpu: ServerCpu | None = None
) -> dict[str, Any]:
    """Enqueue ``scenario.jobs`` jobs, let the clients claim and ack them all (the acks
    move them to finished_jobs), then delete them again, so the tables and counters are
    what they were before. ``server_cpu`` reads the server's CPU seconds (private
    clusters only), for the server's CPU time per job."""
    last_id = _rows(url, "job_ids_last", schema)[0]["last_id"]
    enqueue_measured(url, schema, scenario.jobs)
    vacuum_jobs(url, schema)
    placement = _rows(url, "measured_jobs_pages", schema, {"after_id": last_id})[0]
    activity_before = jobs_activity(url, schema)
    cpu_before = server_cpu() if server_cpu else None
    with client_processes(url, schema, scenario.clients, scenario.batch) as (
        ready,
        reports,
        _,
        procs,
    ):
        ready.wait(timeout=300)
        reports_list = _collect(reports, procs, scenario.timeout)
    cpu_after = server_cpu() if server_cpu else None
    activity_after = jobs_activity(url, schema)
    _rows(url, "measured_jobs_delete", schema, {"after_id": last_id})
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
        if cpu_before is not None and acked
        else None,
        "client_cpu_us_per_job": sum(r["cpu_seconds"] for r in reports_list) / acked * 1e6
        if acked
        else None,
        "claim_latency_ms": _summary_ms(latencies),
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


# -- the history sizes ------------------------------------------------------------------


def run_sizes(
    url: str, scenario: Scenario, progress: LiveLine, server_cpu: ServerCpu | None = None
) -> dict[str, Any]:
    """Measure both schemas at every history size; the history schema grows by COPY."""
    runs: list[dict[str, Any]] = []
    sizes: list[dict[str, Any]] = []
    tag = uuid.uuid4().hex[:8]
    history = f"scale_history_{tag}"
    baseline = f"scale_baseline_{tag}"
    migrate(url, history)
    migrate(url, baseline)
    loaded = 0
    window = HistoryWindow.ending(database.database_now(url).timestamp(), max(scenario.sizes))
    prune: dict[str, Any] | None = None
    try:
        for size in sorted(set(scenario.sizes)):
            load = None
            if size > loaded:
                load = load_history(
                    url, history, loaded, size - loaded, window=window, progress=progress
                )
                loaded = size
                progress.log(
                    f"history {size:,}: loaded {load['rows']:,} rows at "
                    f"{load['rows_per_second']:,.0f}/s, frozen in {load['vacuum_freeze_seconds']:.0f} s"
                )
            for repeat in range(scenario.repeats):
                # Alternate which schema goes first, so neither always gets the warmer cache.
                order = [history, baseline] if repeat % 2 == 0 else [baseline, history]
                for schema in order:
                    role = "history" if schema == history else "baseline"
                    progress.update(
                        f"history {size:,}: {role} run {repeat + 1}/{scenario.repeats}", force=True
                    )
                    run = measure_drain(url, schema, scenario, server_cpu)
                    runs.append({"history_rows": size, "schema": role, "repeat": repeat + 1, **run})
                    progress.log(
                        f"history {size:,} {role}: {run['jobs_per_second']:,.0f} jobs/s, claim p99 "
                        f"{run['claim_latency_ms'].get('p99', float('nan')):.1f} ms, jobs on "
                        f"{run['heap_pages_of_measured_jobs']:,} pages"
                    )
            scrapes = {
                role: measure_scrapes(url, schema, scenario.scrapes)
                for role, schema in (("history", history), ("baseline", baseline))
            }
            progress.log(
                f"history {size:,}: /metrics p50 {scrapes['history']['metrics_ms']['p50']:.1f} ms, "
                f"p99 {scrapes['history']['metrics_ms']['p99']:.1f} ms"
            )
            sizes.append(
                {
                    "history_rows": size,
                    "load": load,
                    "storage": relation_sizes(url, history),
                    "baseline_storage": relation_sizes(url, baseline),
                    "scrapes": scrapes,
                }
            )
        if loaded:
            progress.update(f"history {loaded:,}: pruning the oldest day", force=True)
            prune = measure_prune(url, history, window, loaded)
            progress.log(
                f"history {loaded:,}: pruned {prune['day']} ({prune['jobs_removed'] or 0:,} jobs) "
                f"in {prune['seconds'] * 1000:,.0f} ms; active_jobs dead tuples "
                f"{prune['active_jobs_before'].get('n_dead_tup')} -> "
                f"{prune['active_jobs_after'].get('n_dead_tup')}"
            )
    finally:
        database.drop_schema(url, history)
        database.drop_schema(url, baseline)
    return {"runs": runs, "sizes": sizes, "prune": prune}


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
    expected = _rows(url, "finished_jobs_before", schema, {"before": oldest_end})[0]["jobs"]
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


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _pair_ratios(mine: list[dict[str, Any]], key: str) -> list[float]:
    """history / baseline of ``key`` for each repeat: the two runs of a repeat are
    back to back, so whatever else the machine was doing weighs on both alike."""
    ratios = []
    for repeat in sorted({r["repeat"] for r in mine}):
        pair = {r["schema"]: r.get(key) for r in mine if r["repeat"] == repeat}
        if pair.get("history") and pair.get("baseline"):
            ratios.append(pair["history"] / pair["baseline"])
    return ratios


def summarize_sizes(
    runs: list[dict[str, Any]],
    sizes: list[dict[str, Any]],
    prune: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Per history size: throughput spreads, the ratios the targets are judged on, claim
    latency, CPU per job, scrape times and sizes; and whether the targets are met,
    pruning a day (``prune``, from :func:`measure_prune`) included.

    The throughput ratio is the median over repeats of history / baseline within each
    repeat, which a machine that gets busier or quieter during the run does not skew."""
    by_size: dict[str, Any] = {}
    empty_rate = None
    for entry in sizes:
        size = entry["history_rows"]
        mine = [r for r in runs if r["history_rows"] == size and r["verified"]]

        def of(schema: str, key: str, mine=mine) -> list[float]:
            return [r[key] for r in mine if r["schema"] == schema and r.get(key) is not None]

        history_spread = results.spread(of("history", "jobs_per_second"))
        if size == 0:
            empty_rate = history_spread["median"]
        rate_ratios = _pair_ratios(mine, "jobs_per_second")
        cpu_ratios = _pair_ratios(mine, "server_cpu_us_per_job")
        by_size[str(size)] = {
            "history_rows": size,
            "jobs_per_second": history_spread,
            "baseline_jobs_per_second": results.spread(of("baseline", "jobs_per_second")),
            "throughput_ratios_to_baseline": rate_ratios,
            "ratio_to_baseline": _median(rate_ratios),
            "ratio_to_empty": history_spread["median"] / empty_rate
            if empty_rate and history_spread["median"]
            else None,
            "server_cpu_us_per_job": results.spread(of("history", "server_cpu_us_per_job")),
            "baseline_server_cpu_us_per_job": results.spread(
                of("baseline", "server_cpu_us_per_job")
            ),
            "server_cpu_ratio_to_baseline": _median(cpu_ratios),
            "client_cpu_us_per_job": results.spread(of("history", "client_cpu_us_per_job")),
            "claim_p99_ms": results.spread(
                [r["claim_latency_ms"]["p99"] for r in mine if r["schema"] == "history"]
            ),
            "baseline_claim_p99_ms": results.spread(
                [r["claim_latency_ms"]["p99"] for r in mine if r["schema"] == "baseline"]
            ),
            "heap_pages_of_measured_jobs": results.spread(
                of("history", "heap_pages_of_measured_jobs")
            ),
            "metrics_ms": entry["scrapes"]["history"]["metrics_ms"],
            "status_ms": entry["scrapes"]["history"]["status_ms"],
            "active_table_bytes": entry["storage"]["active_table_bytes"],
            "finished_table_bytes": entry["storage"]["finished_table_bytes"],
            "index_bytes": entry["storage"]["index_bytes"],
            "active_index_bytes": entry["storage"]["active_index_bytes"],
            "claim_index_bytes": entry["storage"]["claim_index_bytes"],
        }
    largest = by_size[str(max(e["history_rows"] for e in sizes))] if sizes else None
    worst_metrics = max((v["metrics_ms"]["p99"] for v in by_size.values()), default=None)
    return {
        "by_history_rows": by_size,
        "targets": {
            "throughput_tolerance": THROUGHPUT_TOLERANCE,
            "largest_history_rows": largest["history_rows"] if largest else None,
            "largest_ratio_to_baseline": largest["ratio_to_baseline"] if largest else None,
            "largest_ratio_to_empty": largest["ratio_to_empty"] if largest else None,
            "largest_server_cpu_ratio_to_baseline": largest["server_cpu_ratio_to_baseline"]
            if largest
            else None,
            "throughput_met": bool(
                largest
                and largest["ratio_to_baseline"] is not None
                and largest["ratio_to_baseline"] >= 1 - THROUGHPUT_TOLERANCE
            ),
            "metrics_budget_ms": METRICS_BUDGET_MS,
            "worst_metrics_p99_ms": worst_metrics,
            "metrics_met": worst_metrics is not None and worst_metrics < METRICS_BUDGET_MS,
            "prune_history_rows": prune["history_rows"] if prune else None,
            "prune_jobs_removed": prune["jobs_removed"] if prune else None,
            "prune_seconds": prune["seconds"] if prune else None,
            "prune_active_dead_tuples_added": prune["active_dead_tuples_added"] if prune else None,
            "prune_met": prune["met"] if prune else None,
        },
    }


# -- the soak ---------------------------------------------------------------------------


def run_soak(url: str, scenario: Scenario, progress: LiveLine) -> dict[str, Any]:
    """Claim and ack at full speed for ``soak_seconds`` with the xmin horizon held back
    in the middle half; sample the table every ``soak_window`` seconds."""
    schema = f"scale_soak_{uuid.uuid4().hex[:8]}"
    migrate(url, schema)
    duration = scenario.soak_seconds
    hold_from, hold_until = duration * 0.25, duration * 0.75
    samples: list[dict[str, Any]] = []
    holder: psycopg.Connection | None = None
    try:
        with client_processes(url, schema, scenario.clients, scenario.batch, soak=True) as (
            ready,
            reports,
            stop_at,
            processes,
        ):
            ready.wait(timeout=300)
            start = time.time()
            stop_at.value = start + duration
            next_sample = start
            while time.time() < start + duration:
                elapsed = time.time() - start
                if holder is None and hold_from <= elapsed < hold_until:
                    holder = psycopg.connect(url, connect_timeout=10)
                    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    holder.execute(statement("horizon_hold", schema)).fetchall()
                    progress.log(f"soak {elapsed:.0f} s: long transaction opened")
                elif holder is not None and elapsed >= hold_until:
                    holder.rollback()
                    holder.close()
                    holder = None
                    progress.log(f"soak {elapsed:.0f} s: long transaction ended")
                if time.time() >= next_sample:
                    samples.append(_soak_sample(url, schema, elapsed, holder is not None))
                    progress.update(
                        f"soak {elapsed:.0f}/{duration:.0f} s, dead tuples "
                        f"{samples[-1]['n_dead_tup']}, horizon held: {holder is not None}",
                        force=True,
                    )
                    next_sample += scenario.soak_window
                time.sleep(0.1)
            client_reports = _collect(reports, processes, 300)
    finally:
        if holder is not None:
            holder.close()
        database.drop_schema(url, schema)
    return _soak_summary(client_reports, samples, start, scenario, hold_from, hold_until)


def _soak_sample(url: str, schema: str, elapsed: float, held: bool) -> dict[str, Any]:
    """The tables at one moment of the soak: the tuple counts are active_jobs' (the
    table claims read), the finished jobs' dead tuples are given apart."""
    activity = jobs_activity(url, schema)
    active = activity["active_jobs"]
    storage = relation_sizes(url, schema)
    return {
        "t": round(elapsed, 1),
        "horizon_held": held,
        "xmin_age": _rows(url, "horizon_age", schema)[0]["xmin_age"],
        "n_dead_tup": active.get("n_dead_tup"),
        "n_live_tup": active.get("n_live_tup"),
        "autovacuum_count": active.get("autovacuum_count"),
        "finished_n_dead_tup": activity["finished_jobs"].get("n_dead_tup"),
        "active_table_bytes": storage["active_table_bytes"],
        "finished_table_bytes": storage["finished_table_bytes"],
        "claim_index_bytes": storage["claim_index_bytes"],
        "index_bytes": storage["index_bytes"],
    }


def _phase(t: float, hold_from: float, hold_until: float) -> str:
    if t < hold_from:
        return "before"
    return "during" if t < hold_until else "after"


def _soak_summary(
    reports: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    start: float,
    scenario: Scenario,
    hold_from: float,
    hold_until: float,
) -> dict[str, Any]:
    """Per window: jobs/s, claim latency, and the table's state; per phase: means."""
    window = scenario.soak_window
    acked: dict[int, int] = {}
    latencies: dict[int, list[float]] = {}
    for report in reports:
        for second, entry in report["per_second"].items():
            index = int((int(second) - start) // window)
            if index < 0:
                continue
            acked[index] = acked.get(index, 0) + entry["acked"]
            latencies.setdefault(index, []).extend(entry["claim_latencies"])
    windows = []
    for index in sorted(acked):
        t = index * window
        if t + window > scenario.soak_seconds + 1:
            continue  # the last, partial window
        sample = next((s for s in samples if s["t"] >= t), samples[-1] if samples else {})
        windows.append(
            {
                "t": t,
                "phase": _phase(t + window / 2, hold_from, hold_until),
                "jobs_per_second": acked[index] / window,
                "claim_latency_ms": _summary_ms(latencies.get(index, [])),
                "n_dead_tup": sample.get("n_dead_tup"),
                "claim_index_bytes": sample.get("claim_index_bytes"),
                "active_table_bytes": sample.get("active_table_bytes"),
            }
        )
    phases = {}
    for name in ("before", "during", "after"):
        mine = [w for w in windows if w["phase"] == name]
        rates = [w["jobs_per_second"] for w in mine]
        phase_samples = [s for s in samples if _phase(s["t"], hold_from, hold_until) == name]
        phases[name] = {
            "windows": len(mine),
            "mean_jobs_per_second": statistics.fmean(rates) if rates else None,
            "min_jobs_per_second": min(rates) if rates else None,
            "last_window_jobs_per_second": rates[-1] if rates else None,
            "worst_claim_p99_ms": max(
                (w["claim_latency_ms"].get("p99", 0) for w in mine), default=None
            ),
            "max_dead_tuples": max((s["n_dead_tup"] or 0 for s in phase_samples), default=None),
            "max_claim_index_bytes": max(
                (s["claim_index_bytes"] for s in phase_samples), default=None
            ),
            "max_xmin_age": max((s["xmin_age"] for s in phase_samples), default=None),
        }
    return {
        "seconds": scenario.soak_seconds,
        "horizon_held_from_s": hold_from,
        "horizon_held_until_s": hold_until,
        "phases": phases,
        "windows": windows,
        "samples": samples,
    }


# -- charts --------------------------------------------------------------------------


def plot_scale(document: dict[str, Any], folder: Path) -> list[Path]:
    """``scale.png``: throughput, claim p99, /metrics and sizes by history rows;
    ``scale-soak.png``: the soak's throughput and dead tuples over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pgqueue_bench.plot import machine_note

    paths = []
    by_size = document["summary"].get("sizes", {}).get("by_history_rows", {})
    if by_size:
        entries = sorted(by_size.values(), key=lambda e: e["history_rows"])
        xs = [max(e["history_rows"], 1) for e in entries]
        labels = [_rows_label(e["history_rows"]) for e in entries]
        figure, axes = plt.subplots(2, 3, figsize=(14, 7.5))
        top_left, top_right, cpu_axes, bottom_left, bottom_right, pages_axes = axes.flat
        for key, label in (
            ("jobs_per_second", "history"),
            ("baseline_jobs_per_second", "no history (same moment)"),
        ):
            medians = [e[key]["median"] or 0 for e in entries]
            lows = [m - (e[key]["min"] or m) for m, e in zip(medians, entries, strict=True)]
            highs = [(e[key]["max"] or m) - m for m, e in zip(medians, entries, strict=True)]
            top_left.errorbar(xs, medians, yerr=[lows, highs], marker="o", capsize=3, label=label)
        top_left.set_ylabel("claim+ack jobs/s (median, bar: min-max)")
        top_left.set_ylim(bottom=0)
        top_left.legend(fontsize=8)
        top_left.set_title("Throughput", fontsize=10)
        for key, label in (("claim_p99_ms", "history"), ("baseline_claim_p99_ms", "no history")):
            top_right.plot(xs, [e[key]["median"] or 0 for e in entries], marker="o", label=label)
        top_right.legend(fontsize=8)
        top_right.set_ylabel("ms (median of runs)")
        top_right.set_ylim(bottom=0)
        top_right.set_title("p99 claim latency", fontsize=10)
        for key, label in (
            ("server_cpu_us_per_job", "history"),
            ("baseline_server_cpu_us_per_job", "no history (same moment)"),
        ):
            cpu_axes.plot(xs, [e[key]["median"] or 0 for e in entries], marker="o", label=label)
        cpu_axes.set_ylabel("PostgreSQL CPU µs per job (median)")
        cpu_axes.set_ylim(bottom=0)
        cpu_axes.legend(fontsize=8)
        cpu_axes.set_title("Server CPU per claimed+acked job", fontsize=10)
        pages_axes.plot(
            xs, [e["heap_pages_of_measured_jobs"]["median"] or 0 for e in entries], marker="o"
        )
        pages_axes.set_yscale("symlog")
        pages_axes.set_ylabel(
            f"active_jobs pages holding the {document['parameters']['jobs']:,} new jobs"
        )
        pages_axes.set_title("Where new jobs are written", fontsize=10)
        for key, label in (("p50", "p50"), ("p99", "p99"), ("max", "max")):
            bottom_left.plot(xs, [e["metrics_ms"][key] for e in entries], marker="o", label=label)
        bottom_left.axhline(
            METRICS_BUDGET_MS, color="red", linestyle="--", linewidth=1, label="50 ms target"
        )
        bottom_left.set_ylabel("ms per GET /metrics")
        bottom_left.set_ylim(bottom=0)
        bottom_left.legend(fontsize=8)
        bottom_left.set_title("/metrics scrape (real app, loopback HTTP)", fontsize=10)
        bottom_right.plot(
            xs, [e["active_table_bytes"] / 2**20 for e in entries], marker="o", label="active_jobs"
        )
        bottom_right.plot(
            xs,
            [e["finished_table_bytes"] / 2**20 for e in entries],
            marker="o",
            label="finished_jobs (all days)",
        )
        bottom_right.plot(
            xs, [e["index_bytes"] / 2**20 for e in entries], marker="o", label="all indexes"
        )
        bottom_right.plot(
            xs, [e["claim_index_bytes"] / 2**20 for e in entries], marker="o", label="claim index"
        )
        bottom_right.set_yscale("symlog")
        bottom_right.set_ylabel("MiB (symlog)")
        bottom_right.legend(fontsize=8)
        bottom_right.set_title("Storage", fontsize=10)
        for ax in axes.flat:
            ax.set_xscale("symlog", linthresh=10_000)
            ax.set_xlim(-2_000, max(xs) * 2)  # room around the first and last points
            ax.set_xticks(xs, labels)
            ax.set_xlabel("finished jobs kept (finished_jobs)")
            ax.grid(True, alpha=0.3)
        params = document["parameters"]
        prune = document["summary"].get("prune")
        pruned = (
            f"\npruning the oldest day of {_rows_label(prune['history_rows'])} "
            f"({prune['jobs_removed'] or 0:,} jobs): {prune['seconds'] * 1000:,.0f} ms, "
            f"active_jobs dead tuples {prune['active_dead_tuples_added']:+,}"
            if prune
            else ""
        )
        figure.suptitle(
            f"Cost per job against history: {params['jobs']:,} jobs per run, {params['clients']} clients, "
            f"batch {params['batch']}{pruned}\n{machine_note(document)}",
            fontsize=10,
        )
        figure.tight_layout()
        path = folder / "scale.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    soak = document["summary"].get("soak")
    if soak and soak.get("windows"):
        figure, axes = plt.subplots(figsize=(9, 4.8))
        ts = [w["t"] + document["parameters"]["soak_window"] / 2 for w in soak["windows"]]
        axes.plot(ts, [w["jobs_per_second"] for w in soak["windows"]], marker=".", label="jobs/s")
        axes.set_ylabel("claim+ack jobs/s")
        axes.set_ylim(bottom=0)
        axes.set_xlabel("seconds")
        axes.axvspan(
            soak["horizon_held_from_s"],
            soak["horizon_held_until_s"],
            color="orange",
            alpha=0.15,
            label="xmin horizon held",
        )
        dead = axes.twinx()
        dead.plot(
            [s["t"] for s in soak["samples"]],
            [s["n_dead_tup"] or 0 for s in soak["samples"]],
            color="gray",
            linestyle="--",
            label="dead tuples",
        )
        dead.set_ylabel("dead tuples in active_jobs (pg_stat)")
        dead.set_ylim(bottom=0)
        lines = axes.get_legend_handles_labels()
        more = dead.get_legend_handles_labels()
        axes.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper right")
        axes.set_title(
            f"Soak with a long transaction holding back the xmin horizon\n{machine_note(document)}",
            fontsize=10,
        )
        axes.grid(True, alpha=0.3)
        figure.tight_layout()
        path = folder / "scale-soak.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def _rows_label(rows: int) -> str:
    if rows >= 1_000_000:
        return f"{rows / 1_000_000:g}M"
    if rows >= 1_000:
        return f"{rows / 1_000:g}k"
    return str(rows)


# -- the command ------------------------------------------------------------------------


def _private_target(
    like_url: str | None, extra_settings: dict[str, str]
) -> tuple[database.Target, PrivateServer]:
    """A private cluster for this command, destroyed when the command ends."""
    chosen = {**PRIVATE_SERVER_SETTINGS, **extra_settings}
    server = PrivateServer(binaries_for(like_url), settings=chosen)
    server.create()
    click.get_current_context().call_on_close(server.destroy)
    server.start()
    settings = ", ".join(f"{name}={value}" for name, value in chosen.items())
    target = database.Target(server.url(), f"private cluster, {server.binaries.label}, {settings}")
    return target, server


def _setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise click.BadParameter(f"{text!r} is not NAME=VALUE")
    return name.strip(), value.strip()


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of row counts") from None
    if not values or any(v < 0 for v in values):
        raise click.BadParameter("sizes must be non-negative row counts")
    return values


@click.command("scale")
@click.option(
    "--sizes",
    default=",".join(map(str, SIZES)),
    show_default=True,
    help="Finished jobs of history to measure at, comma-separated.",
)
@click.option(
    "--jobs",
    type=click.IntRange(100),
    default=20_000,
    show_default=True,
    help="Jobs claimed and acked per run.",
)
@click.option(
    "--clients", type=click.IntRange(1), default=2, show_default=True, help="Claiming processes."
)
@click.option(
    "--batch", type=click.IntRange(1), default=10, show_default=True, help="Jobs per claim."
)
@click.option("--repeats", type=click.IntRange(1), default=5, show_default=True)
@click.option(
    "--scrapes",
    type=click.IntRange(10),
    default=200,
    show_default=True,
    help="GET /metrics per size.",
)
@click.option(
    "--soak-seconds",
    type=click.FloatRange(0),
    default=600.0,
    show_default=True,
    help="0 skips the soak.",
)
@click.option("--quick", is_flag=True, help="Sizes 0 and 100k, 3000 jobs, one repeat, a 60 s soak.")
@click.option("--database-url", help="Run on this server instead of a private cluster.")
@click.option(
    "--server-setting",
    "server_settings",
    multiple=True,
    callback=lambda ctx, param, values: [_setting(value) for value in values],
    metavar="NAME=VALUE",
    help="A setting of the private cluster, e.g. shared_buffers=2GB (repeatable).",
)
@click.option("--results-dir", type=click.Path(file_okay=False), help="Default: ./results.")
@click.option("--results-name", default="scale", show_default=True)
def scale_command(
    sizes: str,
    jobs: int,
    clients: int,
    batch: int,
    repeats: int,
    scrapes: int,
    soak_seconds: float,
    quick: bool,
    database_url: str | None,
    server_settings: list[tuple[str, str]],
    results_dir: str | None,
    results_name: str,
) -> None:
    """Claim+ack throughput, claim latency, /metrics time and sizes with 0 to 5M
    finished jobs kept, pruning the oldest day of them, and a soak with the xmin
    horizon held back."""
    scenario = Scenario(
        sizes=QUICK_SIZES if quick else _sizes(sizes),
        jobs=min(jobs, 3000) if quick else jobs,
        clients=clients,
        batch=batch,
        repeats=1 if quick else repeats,
        scrapes=min(scrapes, 50) if quick else scrapes,
        soak_seconds=min(soak_seconds, 60.0) if quick else soak_seconds,
    )
    server_cpu: ServerCpu | None = None
    if database_url:
        target = database.Target(database_url, "given with --database-url")
    else:
        target, server = _private_target(None, dict(server_settings))
        postmaster = server.postmaster_pid()
        if postmaster is not None:
            server_cpu = functools.partial(postgres_cpu_seconds, postmaster)
    summary: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    with LiveLine() as progress:
        measured = run_sizes(target.url, scenario, progress, server_cpu)
        runs = measured["runs"]
        details["sizes"] = measured["sizes"]
        summary["sizes"] = summarize_sizes(runs, measured["sizes"], measured["prune"])
        summary["prune"] = measured["prune"]
        if scenario.soak_seconds > 0:
            summary["soak"] = run_soak(target.url, scenario, progress)
    targets = summary["sizes"]["targets"]
    click.echo(
        f"throughput at {targets['largest_history_rows']:,} history rows: "
        f"{(targets['largest_ratio_to_baseline'] or 0):.1%} of the no-history baseline, "
        f"{(targets['largest_ratio_to_empty'] or 0):.1%} of the empty-table run "
        f"(target >= {1 - THROUGHPUT_TOLERANCE:.0%}: {'met' if targets['throughput_met'] else 'NOT met'})"
    )
    cpu_ratio = targets["largest_server_cpu_ratio_to_baseline"]
    if cpu_ratio is not None:
        click.echo(f"server CPU per job at that size: {cpu_ratio:.2f}x the no-history baseline")
    click.echo(
        f"/metrics worst p99 {targets['worst_metrics_p99_ms']:.1f} ms "
        f"(target < {METRICS_BUDGET_MS:g} ms: {'met' if targets['metrics_met'] else 'NOT met'})"
    )
    prune = summary["prune"]
    if prune is not None:
        click.echo(
            f"pruning the oldest day ({prune['day']}) of {prune['history_rows']:,} history rows: "
            f"{prune['jobs_removed'] or 0:,} jobs in {prune['seconds'] * 1000:,.0f} ms "
            f"({'checked' if prune['verified'] else 'NOT as counted before'}); active_jobs "
            f"dead tuples {prune['active_dead_tuples_added']:+,}, rows deleted or updated "
            f"{prune['active_rows_deleted_or_updated']:,} "
            f"(target: none: {'met' if prune['met'] else 'NOT met'})"
        )
    if "soak" in summary:
        for name, phase in summary["soak"]["phases"].items():
            rate = phase["mean_jobs_per_second"]
            click.echo(
                f"soak {name}: mean {rate or 0:,.0f} jobs/s, max dead tuples in active_jobs "
                f"{phase['max_dead_tuples']}"
            )
    parameters = {
        **asdict(scenario),
        "soak_window": scenario.soak_window,
        "queue": QUEUE_NAME,
        "history_mix": "94% succeeded, 4% dead, 2% cancelled; 70% in the measured queue",
        "history_days": f"finished evenly over the {HISTORY_DAYS} whole UTC days before the "
        "first load's day and that day up to the load, COPYed into finished_jobs' day "
        "partitions and added to queue_counters",
        "storage": "active_jobs holds queued and running jobs; finished_jobs (partitioned by "
        "state, then UTC day) the history; table bytes include TOAST",
        "prune": "Queue.prune_expired with a retention that expires the oldest day only, "
        "on the largest history; active_jobs statistics read once published",
        "dead_tuples": "n_dead_tup of active_jobs (pg_stat_user_tables)",
        "rate": "acked jobs / (last ack - first claim), per run, wall clock",
        "ratio_to_baseline": "median over repeats of history / baseline within the repeat",
        "server_cpu": "CPU seconds of the private cluster's processes during a run / jobs",
        "claim_latency": "one Queue.claim call of up to `batch` jobs, timed in the client",
    }
    document = results.document(
        "scale",
        environment=environment.describe(target.url, target.server),
        parameters=parameters,
        runs=runs,
        summary=summary,
    )
    document["sizes"] = details["sizes"]
    path = results.write(results_name, document, results_dir)
    click.echo(f"wrote {path}")
    for chart in plot_scale(document, results.results_dir(results_dir)):
        click.echo(f"wrote {chart}")
