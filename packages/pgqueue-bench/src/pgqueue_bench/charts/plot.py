"""PNG charts of the results files, drawn with matplotlib's Agg backend (no display).

Each chart shows the median of the runs, with a bar from the fastest to the slowest
run, and names the machine it ran on. The scale and soak drivers' charts
(:mod:`~pgqueue_bench.charts.scale`, :mod:`~pgqueue_bench.charts.soak`) are drawn and saved
through :func:`subplots` and :func:`save` here.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import click
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # the backend is chosen above, before pyplot loads
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pgqueue_bench import results
from pgqueue_bench.options import results_dir_option


def machine_note(document: dict[str, Any]) -> str:
    """'2 CPUs (AMD EPYC), PostgreSQL 18.4' for a chart's caption."""
    env = document.get("environment", {})
    machine = env.get("machine", {})
    pg = env.get("postgresql", {})
    version = (pg.get("version") or "").split(" on ")[0]
    return f"{machine.get('cpu_count')} CPUs ({machine.get('cpu_model')}), {version}"


def _series(
    runs: list[dict[str, Any]], group: str, x: str, y: str
) -> dict[str, dict[float, list[float]]]:
    """{group value: {x value: [y per run]}} over the runs that have a y."""
    out: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run.get(y) is not None and run.get("verified", True):
            out[str(run[group])][float(run[x])].append(float(run[y]))
    return out


def _draw_lines(axes: Axes, series: dict[str, dict[float, list[float]]]) -> None:
    for label, points in series.items():
        xs = sorted(points)
        medians = [sorted(points[x])[len(points[x]) // 2] for x in xs]
        lows = [m - min(points[x]) for m, x in zip(medians, xs, strict=True)]
        highs = [max(points[x]) - m for m, x in zip(medians, xs, strict=True)]
        axes.errorbar(xs, medians, yerr=[lows, highs], marker="o", capsize=3, label=label)


def subplots(*args: Any, **kwargs: Any) -> Any:
    """A new figure and its axes, as :func:`matplotlib.pyplot.subplots` makes them, on
    the Agg backend chosen here."""
    return plt.subplots(*args, **kwargs)


def save(
    figure: Figure,
    path: Path,
    *,
    dpi: int = 110,
    rect: tuple[float, float, float, float] | None = None,
) -> Path:
    """Lay ``figure`` out (within ``rect`` of it, if given), write it to ``path`` as a
    PNG of ``dpi`` and close it."""
    figure.tight_layout(rect=rect)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path


def plot_throughput(document: dict[str, Any], folder: Path) -> list[Path]:
    """Jobs per second by worker processes, one line per claim mode."""
    series = _series(document["runs"], "mode", "workers", "jobs_per_second")
    figure, axes = plt.subplots(figsize=(7, 4.5))
    _draw_lines(axes, series)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted({x for points in series.values() for x in points}))
    axes.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set_xlabel("worker processes")
    axes.set_yscale("log")
    axes.set_ylabel("jobs/s, log scale (median, bar: min-max)")
    axes.set_title(
        f"Throughput, {document['parameters'].get('jobs')} no-op jobs\n{machine_note(document)}",
        fontsize=10,
    )
    axes.grid(True, alpha=0.3)
    axes.legend()
    return [save(figure, folder / "throughput.png")]


def plot_latency(document: dict[str, Any], folder: Path) -> list[Path]:
    """p50, p95 and p99 pickup latency per wake-up mode (median over runs)."""
    by_mode: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in document["runs"]:
        for name in ("p50", "p95", "p99"):
            by_mode[run["mode"]][name].append(run["latency_ms"][name])
    return [
        _bars(
            by_mode,
            folder / "latency.png",
            f"Pickup latency at {document['parameters'].get('rate'):g} jobs/s\n"
            f"{machine_note(document)}",
        )
    ]


def _bars(groups: dict[str, dict[str, list[float]]], path: Path, title: str) -> Path:
    names = ("p50", "p95", "p99")
    figure, axes = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(1, len(groups))
    for index, (label, values) in enumerate(groups.items()):
        medians = [sorted(values[n])[len(values[n]) // 2] for n in names]
        positions = [i + index * width for i in range(len(names))]
        bars = axes.bar(positions, medians, width, label=label)
        axes.bar_label(bars, fmt="%.1f", fontsize=8)
    axes.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(names))], names)
    axes.set_yscale("log")
    axes.set_ylim(bottom=0.1)
    axes.set_ylabel("ms from runnable to first claim (log)")
    axes.set_title(title, fontsize=10)
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()
    return save(figure, path)


def plot_peers(document: dict[str, Any], folder: Path) -> list[Path]:
    """Throughput by worker processes per system, and latency percentiles per system."""
    runs = [run for run in document["runs"] if run["scenario"] == "throughput"]
    series = _series(runs, "system", "workers", "jobs_per_second")
    figure, axes = plt.subplots(figsize=(7, 4.5))
    _draw_lines(axes, series)
    axes.set_xticks(sorted({x for points in series.values() for x in points}))
    axes.set_xlabel("worker processes")
    axes.set_yscale("log")
    axes.set_ylabel("jobs/s, log scale (median, bar: min-max)")
    axes.set_title(
        f"pgqueue and peers, {document['parameters'].get('jobs')} no-op jobs\n"
        f"{machine_note(document)}",
        fontsize=10,
    )
    axes.grid(True, alpha=0.3)
    axes.legend()
    paths = [save(figure, folder / "peers.png")]
    latency: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in document["runs"]:
        if run["scenario"] == "latency" and run["verified"]:
            for name in ("p50", "p95", "p99"):
                latency[run["system"]][name].append(run["latency_ms"][name])
    if latency:
        paths.append(
            _bars(
                latency,
                folder / "peers-latency.png",
                f"Pickup latency at {document['parameters'].get('rate'):g} jobs/s\n"
                f"{machine_note(document)}",
            )
        )
    return paths


PLOTTERS = {"throughput": plot_throughput, "latency": plot_latency, "peers": plot_peers}


def plot_all(directory: Path | str | None = None) -> list[Path]:
    """Draw every chart whose results file exists; return the PNG paths."""
    folder = results.results_dir(directory)
    paths: list[Path] = []
    for name, plotter in PLOTTERS.items():
        document = results.read(name, folder)
        if document is not None and document.get("runs"):
            paths += plotter(document, folder)
    return paths


@click.command("plot")
@results_dir_option
def plot_command(results_dir: str | None) -> None:
    """Draw PNG charts from the JSON results (throughput, latency, peers)."""
    paths = plot_all(results_dir)
    if not paths:
        raise click.ClickException("no results to plot: run the benchmarks first")
    for path in paths:
        click.echo(f"wrote {path}")
