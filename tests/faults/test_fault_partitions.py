"""Scenario 14: partition concurrency limits under races, a SIGKILLed worker and a
PostgreSQL restart.

Many worker processes claim jobs of a few partition keys at once; the queue's
``partition_concurrency_limit`` must hold for every key at every instant, as the
database shows it (running jobs per key, sampled all along) and as the handlers lived it
(each invocation's span, logged by the worker process itself). A worker SIGKILLed in
the middle of a job keeps its slot of the key until the reaper takes the job back; then
the key's remaining jobs all complete. After PostgreSQL restarts, the limit still holds
and every acknowledged job completes once: nothing lost, nothing acked twice.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import fault_sql
import psycopg
import pytest
from fault_support import MAX_ATTEMPTS, QUEUE_NAME, SCHEMA, FaultRun
from fault_tasks import PARTITION_TASK, SPANS_PREFIX
from polling import wait_for

from pgqueue import JobSpec, JobState
from pgqueue_bench.verdict import deliveries


def partition_jobs(prefix: str, per_key: dict[str, int], **payload: object) -> list[JobSpec]:
    """Jobs of the span-logging task, ``per_key[key]`` of each key, each with an
    idempotency key of its own."""
    return [
        JobSpec(
            PARTITION_TASK,
            {"ms": [10, 40], **payload},
            queue=QUEUE_NAME,
            partition_key=key,
            idempotency_key=f"{prefix}-{key}-{n}",
            max_attempts=MAX_ATTEMPTS,
        )
        for key, count in per_key.items()
        for n in range(count)
    ]


class RunningSampler:
    """Reads how many jobs of each key are running, over and over, on a thread of its
    own, until stopped; a read the server cannot answer (it is restarting) is skipped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.most: dict[str, int] = defaultdict(int)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="running-sampler", daemon=True)

    def __enter__(self) -> RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                    while not self._stop.is_set():
                        rows = fault_sql.execute(
                            conn, "running_per_partition", {"queue": QUEUE_NAME}, schema=SCHEMA
                        )
                        for row in rows:
                            key = row["partition_key"]
                            self.most[key] = max(self.most[key], row["running"])
                        self.samples += 1
                        time.sleep(0.005)
            except psycopg.Error:
                time.sleep(0.1)


def read_spans(
    run_dir: Path, ended_by_kill: dict[int, float] | None = None
) -> dict[str, list[tuple[int, float, float]]]:
    """Per key, (job id, start, end) of every handler invocation. One that never logged
    its end ran in a process killed at ``ended_by_kill[pid]``; any other is still open."""
    starts: dict[tuple[int, int, int], tuple[str, float]] = {}
    ends: dict[tuple[int, int, int], float] = {}
    for path in run_dir.glob(f"{SPANS_PREFIX}*.log"):
        for line in deliveries.complete_lines(path):
            edge, job_id, attempt, key, at, pid = line.split()
            attempt_of = (int(job_id), int(attempt), int(pid))
            if edge == "start":
                starts[attempt_of] = (key, float(at))
            else:
                ends[attempt_of] = float(at)
    spans: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for attempt_of, (key, start) in starts.items():
        end = ends.get(attempt_of, (ended_by_kill or {}).get(attempt_of[2], float("inf")))
        spans[key].append((attempt_of[0], start, end))
    return spans


def most_at_once(spans: list[tuple[int, float, float]]) -> int:
    """The most spans open at one instant (an end and a start at once do not overlap)."""
    edges = sorted([(start, 1) for _, start, _ in spans] + [(end, -1) for _, _, end in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_many_workers_claiming_at_once_never_exceed_a_keys_limit(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    limit = 2
    keys = {f"k{n}": 100 for n in range(4)}
    with FaultRun.prepared(server.url(), tmp_path) as run:
        run.queue.update_queue(QUEUE_NAME, partition_concurrency_limit=limit, create=True)
        # Leases long enough that none expires on a loaded machine: an attempt the
        # reaper took back would run beside its successor, which no limit forbids.
        fleet = run.start_workers(8, concurrency=4, lease_seconds=10.0, heartbeat_seconds=1.0)
        with RunningSampler(run.url) as sampler:
            run.enqueue(partition_jobs("race", keys))
            run.wait_until_done()
        verdict = run.verdict()
        spans = read_spans(tmp_path)
        discarded = fleet.discarded_outcomes()

    assert sampler.samples > 50
    assert all(most <= limit for most in sampler.most.values()), dict(sampler.most)
    # The limit was reached, not merely never approached.
    assert max(sampler.most.values()) == limit, dict(sampler.most)
    for key in keys:
        lived = [span for span in spans[key] if span[0] not in discarded]
        assert most_at_once(lived) <= limit, key
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 400}
    record_figures(
        "14-partition-limit-race",
        verdict.figures(
            workers=8,
            partition_concurrency_limit=limit,
            most_running_per_key=dict(sampler.most),
            samples=sampler.samples,
            outcomes_discarded=len(discarded),
        ),
    )


def test_a_killed_workers_slot_of_a_key_comes_back_with_the_reaper(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    with FaultRun.prepared(server.url(), tmp_path) as run:
        run.queue.update_queue(QUEUE_NAME, partition_concurrency_limit=1, create=True)
        # A lease that outlasts the check below by seconds, however the heartbeats fell.
        fleet = run.start_workers(3, concurrency=2, lease_seconds=4.0, heartbeat_seconds=0.5)
        with RunningSampler(run.url) as sampler:
            specs = partition_jobs("kill", {"one": 12, "other": 15}, ms=400)
            key_of = {
                job_id: spec.partition_key
                for spec, job_id in zip(specs, run.enqueue(specs), strict=True)
            }

            def running_one() -> tuple[int, int] | None:
                for process in fleet.running():
                    for job_id in run.claimed_by(process.pid):
                        if key_of[job_id] == "one":
                            return process.pid, job_id
                return None

            pid, victim = wait_for(running_one, 60, what="a job of key 'one' to run")
            [process] = [p for p in fleet.processes if p.pid == pid]
            fleet.kill(process)
            killed_at = time.time()
            # Until the reaper takes it back, the dead worker's job holds the key's
            # only slot: nothing else of the key starts.
            time.sleep(1.0)
            assert run.queue.get(victim).state is JobState.RUNNING
            others = run.queue.list(queue=QUEUE_NAME, partition_key="one", state="running")
            assert [job.id for job in others.jobs] == [victim]
            run.wait_until_done()
        verdict = run.verdict()
        spans = read_spans(tmp_path, {pid: killed_at})
        rescued = run.queue.get(victim)

    assert sampler.most["one"] == 1, dict(sampler.most)
    assert most_at_once(spans["one"]) == 1
    assert rescued.state is JobState.SUCCEEDED and rescued.attempts >= 2
    assert any(e["error"].startswith("lease expired") for e in rescued.errors), rescued.errors
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 27}
    record_figures(
        "14-partition-killed-worker",
        verdict.figures(most_running_per_key=dict(sampler.most), samples=sampler.samples),
    )


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_partition_limits_hold_across_a_server_restart(
    start_server, record_figures, tmp_path: Path, mode: str
) -> None:
    server = start_server()
    limit = 2
    keys = {f"k{n}": 80 for n in range(3)}
    with FaultRun.prepared(server.url(), tmp_path) as run:
        run.queue.update_queue(QUEUE_NAME, partition_concurrency_limit=limit, create=True)
        run.start_workers(4, concurrency=4)
        with RunningSampler(run.url) as sampler:
            run.enqueue(partition_jobs("restart", keys, ms=[20, 80]))
            run.wait_until_succeeded(40)
            in_flight = run.counts()
            server.stop(mode)
            server.start()
            restarted_at = run.now()
            run.wait_until_done()
        verdict = run.verdict()
        spans = read_spans(tmp_path)

    assert in_flight["queued"] > 0
    assert all(most <= limit for most in sampler.most.values()), dict(sampler.most)
    for key in keys:
        assert most_at_once(spans[key]) <= limit, key
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 240}
    record_figures(
        f"14-partition-restart-{mode}",
        verdict.figures(
            recovery_seconds=verdict.recovery_seconds(restarted_at),
            most_running_per_key=dict(sampler.most),
            samples=sampler.samples,
        ),
    )
