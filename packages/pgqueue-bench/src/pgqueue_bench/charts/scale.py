"""The scale driver's charts: ``scale.png`` (throughput, claim latency, server CPU,
where new jobs are written, /metrics time and storage, by history size) and
``scale-soak.png`` (the soak's throughput and dead tuples over time), drawn from a
results document alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgqueue_bench.charts.plot import machine_note, save, subplots
from pgqueue_bench.scenarios.scale.scenario import METRICS_BUDGET_MS


def plot_scale(document: dict[str, Any], folder: Path) -> list[Path]:
    """``scale.png``: throughput, claim p99, /metrics and sizes by history rows;
    ``scale-soak.png``: the soak's throughput and dead tuples over time."""
    paths = []
    by_size = document["summary"].get("sizes", {}).get("by_history_rows", {})
    if by_size:
        entries = sorted(by_size.values(), key=lambda e: e["history_rows"])
        xs = [max(e["history_rows"], 1) for e in entries]
        labels = [_rows_label(e["history_rows"]) for e in entries]
        figure, axes = subplots(2, 3, figsize=(14, 7.5))
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
        paths.append(save(figure, folder / "scale.png"))
    soak = document["summary"].get("soak")
    if soak and soak.get("windows"):
        figure, axes = subplots(figsize=(9, 4.8))
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
        paths.append(save(figure, folder / "scale-soak.png"))
    return paths


def _rows_label(rows: int) -> str:
    if rows >= 1_000_000:
        return f"{rows / 1_000_000:g}M"
    if rows >= 1_000:
        return f"{rows / 1_000:g}k"
    return str(rows)
