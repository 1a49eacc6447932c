"""The scale driver's soak: claim and ack at full speed for ``--soak-seconds`` while a
long transaction holds back the xmin horizon in the middle half, sampling the hot table
every window; then throughput, claim latency and dead tuples per window and per phase
(before, during and after the hold).
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any, TypedDict

import psycopg

from pgqueue import migrate
from pgqueue_bench.infra import database
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.scale.clients import (
    claim_latency_ms,
    client_processes,
    collect_reports,
)
from pgqueue_bench.scenarios.scale.history import jobs_activity, relation_sizes
from pgqueue_bench.scenarios.scale.scenario import Scenario
from pgqueue_bench.scenarios.scale.statements import run_statement, statement


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
            client_reports = collect_reports(reports, processes, 300)
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
        "xmin_age": run_statement(url, "horizon_age", schema)[0]["xmin_age"],
        "n_dead_tup": active.get("n_dead_tup"),
        "n_live_tup": active.get("n_live_tup"),
        "autovacuum_count": active.get("autovacuum_count"),
        "finished_n_dead_tup": activity["finished_jobs"].get("n_dead_tup"),
        "active_table_bytes": storage["active_table_bytes"],
        "finished_table_bytes": storage["finished_table_bytes"],
        "claim_index_bytes": storage["claim_index_bytes"],
        "index_bytes": storage["index_bytes"],
    }


class SoakWindow(TypedDict):
    """One window of the soak: its start (seconds into the soak), the horizon's phase
    at its middle, its throughput and claim latency, and the table's state at the
    first sample from its start on."""

    t: float
    phase: str
    jobs_per_second: float
    claim_latency_ms: dict[str, float]
    n_dead_tup: int | None
    claim_index_bytes: int | None
    active_table_bytes: int | None


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
    windows: list[SoakWindow] = []
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
                "claim_latency_ms": claim_latency_ms(latencies.get(index, [])),
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
