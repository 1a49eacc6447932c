"""The summary of the scale driver's history sizes: per size, the spreads over repeats,
the ratios the throughput target is judged on, and whether the targets are met.

Apart from the measurements because it reads only what they returned: no server, no
connection, only the runs and the sizes' records.
"""

from __future__ import annotations

from typing import Any

from pgqueue_bench import results
from pgqueue_bench.scenarios.scale.scenario import METRICS_BUDGET_MS, THROUGHPUT_TOLERANCE


def _pair_ratios(mine: list[dict[str, Any]], key: str) -> list[float]:
    """history / baseline of ``key`` for each repeat: the two runs of a repeat are
    back to back, so whatever else the machine was doing weighs on both alike."""
    ratios: list[float] = []
    for repeat in sorted({r["repeat"] for r in mine}):
        pair = {r["schema"]: r.get(key) for r in mine if r["repeat"] == repeat}
        history: float | None = pair.get("history")
        baseline: float | None = pair.get("baseline")
        if history and baseline:
            ratios.append(history / baseline)
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

        def of(schema: str, key: str, mine: list[dict[str, Any]] = mine) -> list[float]:
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
            "ratio_to_baseline": results.spread(rate_ratios)["median"],
            "ratio_to_empty": history_spread["median"] / empty_rate
            if empty_rate and history_spread["median"]
            else None,
            "server_cpu_us_per_job": results.spread(of("history", "server_cpu_us_per_job")),
            "baseline_server_cpu_us_per_job": results.spread(
                of("baseline", "server_cpu_us_per_job")
            ),
            "server_cpu_ratio_to_baseline": results.spread(cpu_ratios)["median"],
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
