"""The processes that claim and ack for the scale driver.

Claim clients (:func:`drain_client`) and the soak's producer (:func:`backlog_producer`)
run in spawned processes, each with an interpreter of its own, so that neither the
driver's sampling nor each other's GIL slows them; :func:`client_processes` starts them
behind one barrier and :func:`collect_reports` gathers what they report.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

from pgqueue import JobSpec, Queue, WorkerProtocol
from pgqueue_bench import handlers
from pgqueue_bench.scenarios.latency import percentiles
from pgqueue_bench.scenarios.scale.scenario import QUEUE_NAME, SOAK_BACKLOG

# -- claim and ack clients (child processes) -----------------------------------------


def claim_latency_ms(latencies: list[float]) -> dict[str, float]:
    """The percentiles of claim latencies as the clients time them (seconds), in
    milliseconds; empty without any."""
    return percentiles([seconds * 1000 for seconds in latencies]) if latencies else {}


def drain_client(
    url: str, schema: str, batch: int, ready: Any, results_queue: Any, stop_at: Any | None
) -> None:
    """Claim ``batch`` jobs, ack them, repeat: until none is left (``stop_at`` None), or
    until the wall clock reaches ``stop_at.value`` (a shared double that the driver sets
    once every process is ready). Puts a report on ``results_queue``: the first claim
    and last ack (wall clock), jobs acked, and claim latencies, overall or per second."""
    queue = Queue.connect(url, schema=schema, min_size=1, max_size=1)
    protocol = WorkerProtocol(queue)
    tasks = [handlers.NOOP_TASK]
    claims: list[float] = []
    per_second: dict[int, list[float]] = {}
    acked_per_second: dict[int, int] = {}
    acked = 0
    empty_claims = 0
    try:
        protocol.next_run_in([QUEUE_NAME], tasks)  # connected before the clock starts
        ready.wait()
        deadline = _deadline(stop_at)
        started = time.time()
        cpu_started = time.process_time()
        while True:
            before = time.perf_counter()
            jobs = protocol.claim([QUEUE_NAME], tasks, batch)
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
            protocol.ack_many([(job, None) for job in jobs])
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
    return _stop_time(stop_at)


def _stop_time(stop_at: Any) -> float:
    """The shared double ``stop_at``, once the driver has set it."""
    while stop_at.value == 0.0:
        time.sleep(0.001)
    return float(stop_at.value)


def backlog_producer(url: str, schema: str, backlog: int, ready: Any, stop_at: Any) -> None:
    """Keep at least ``backlog`` runnable jobs queued until ``stop_at.value`` (wall
    clock), reading the queued count as /metrics does, from active_jobs, which holds no
    history, so the reading costs the same however much history is kept."""
    queue = Queue.connect(url, schema=schema, min_size=1, max_size=1)
    chunk = max(1000, backlog // 2)
    try:
        ready.wait()
        # Only the soak runs a producer, and the soak always shares a stop time.
        deadline = _stop_time(stop_at)
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


def collect_reports(reports: Any, processes: list[Any], timeout: float) -> list[dict[str, Any]]:
    """One report from each of ``processes``, off the ``reports`` queue. Raises when
    they are not all in after ``timeout`` seconds, or when every process has exited and
    a report is still missing."""
    collected: list[dict[str, Any]] = []
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
