"""The fairness driver's chart: the small tenants' pickup latency in each phase, beside
the rate each phase drained at (median over runs, bar: min-max)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgqueue_bench.charts.plot import machine_note, save, subplots
from pgqueue_bench.scenarios.fairness.summary import BIG_TENANT, PERCENTILES, SMALL_TENANTS


def _bar_with_range(
    axes: Any, position: float, spread: dict[str, Any], width: float, **style: Any
) -> Any:
    median = spread["median"]
    error = [[median - spread["min"]], [spread["max"] - median]]
    return axes.bar([position], [median], width, yerr=error, capsize=3, **style)


def plot_fairness(document: dict[str, Any], path: Path) -> list[Path]:
    """The chart at ``path`` (results/fairness.png): the small tenants' p50 and p99 pickup per phase (log
    scale), with the large tenant's p50 where there was one, and jobs/s per phase."""
    phases = {
        name: figures
        for name, figures in document["summary"]["phases"].items()
        if figures[SMALL_TENANTS]["p99"]["median"] is not None
    }
    figure, (latency, rate) = subplots(1, 2, figsize=(10, 4.5), width_ratios=(3, 2))
    width = 0.8 / (len(PERCENTILES) + 1)
    for index, figures in enumerate(phases.values()):
        for offset, percentile in enumerate(PERCENTILES):
            bars = _bar_with_range(
                latency,
                index + offset * width,
                figures[SMALL_TENANTS][percentile],
                width,
                color=f"C{offset}",
                label=f"small tenants {percentile}" if index == 0 else None,
            )
            latency.bar_label(bars, fmt="%.0f", fontsize=7)
        big = figures["tenants"].get(BIG_TENANT, {}).get("p50")
        if big and big["median"] is not None:
            bars = _bar_with_range(
                latency,
                index + len(PERCENTILES) * width,
                big,
                width,
                color="C7",
                label="large tenant p50" if "large tenant p50" not in _labels(latency) else None,
            )
            latency.bar_label(bars, fmt="%.0f", fontsize=7)
    latency.set_xticks([i + width for i in range(len(phases))], list(phases))
    latency.set_yscale("log")
    latency.set_ylabel("ms from runnable to claim (log; bar: min-max)")
    latency.set_title("Pickup latency", fontsize=10)
    latency.grid(True, axis="y", alpha=0.3)
    latency.legend(fontsize=8)
    rated = {
        name: figures for name, figures in phases.items() if figures["jobs_per_second"]["median"]
    }
    for index, figures in enumerate(rated.values()):
        bars = _bar_with_range(rate, index, figures["jobs_per_second"], 0.6, color=f"C{index + 2}")
        rate.bar_label(bars, fmt="%.0f", fontsize=8)
    rate.set_xticks(list(range(len(rated))), list(rated))
    rate.set_ylabel("jobs/s (bar: min-max)")
    rate.set_title("Drain rate, all tenants", fontsize=10)
    rate.grid(True, axis="y", alpha=0.3)
    params = document["parameters"]
    figure.suptitle(
        f"A {params.get('big_jobs'):,}-job backlog beside {params.get('small_tenants')} small "
        f"tenants at {params.get('small_rate'):g} jobs/s each, {params.get('job_ms'):g} ms "
        f"jobs, {params.get('workers')} workers\n{machine_note(document)}",
        fontsize=10,
    )
    return [save(figure, path, rect=(0, 0, 1, 0.92))]


def _labels(axes: Any) -> list[str]:
    return [str(label) for label in axes.get_legend_handles_labels()[1]]
