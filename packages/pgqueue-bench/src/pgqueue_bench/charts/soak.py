"""The soak's chart: one panel per sampled series, on one time axis, every fault a
shaded span in its kind's colour, so a dip or a climb can be read against what was
injected at that moment. Samples the database could not answer are gaps, not zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.patches import Patch

from pgqueue_bench.charts.plot import machine_note, save, subplots

FAULT_COLOURS = {
    "server_crash": "tab:red",
    "backend_kill": "tab:orange",
    "terminate_backends": "tab:olive",
    "read_only": "tab:purple",
    "worker_sigkill": "tab:brown",
    "worker_sigstop": "tab:cyan",
    "blackhole": "tab:gray",
}
# Tables too small to see beside the others are left out of the size panels.
SHOWN_TABLES = ("active_jobs", "finished_jobs", "job_audit", "job_dependencies", "idempotency_keys")


def _minutes(sample: dict[str, Any]) -> float:
    return float(sample["elapsed_seconds"]) / 60


def _line(
    axes: Axes,
    samples: list[dict[str, Any]],
    value: Callable[[dict[str, Any]], Any],
    **style: Any,
) -> None:
    """One series; a sample without a value (missing) breaks the line."""
    xs = [_minutes(s) for s in samples]
    ys = [value(s) for s in samples]
    axes.plot(xs, [float("nan") if y is None else y for y in ys], **style)


def _db(sample: dict[str, Any], *path: str) -> Any:
    if sample.get("missing") is not None:
        return None
    value: Any = sample
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _db_at(*path: str) -> Callable[[dict[str, Any]], Any]:
    """The series of the database figure at ``path`` in each sample."""
    return lambda sample: _db(sample, *path)


def _rss_of(label: str) -> Callable[[dict[str, Any]], Any]:
    """The series of process ``label``'s memory (read from /proc, so never missing)."""
    return lambda sample: sample.get("rss_mib", {}).get(label)


def _panels(axes_list: Sequence[Axes], samples: list[dict[str, Any]]) -> None:
    throughput, depth, pickup, rss, connections, sizes, dead = axes_list
    _line(throughput, samples, _db_at("throughput_per_second"), color="tab:blue")
    throughput.set_ylabel("finished\njobs/s")
    for state, colour in (
        ("queued", "tab:blue"),
        ("running", "tab:green"),
        ("waiting", "tab:pink"),
    ):
        _line(depth, samples, _db_at("depth", state), label=state, color=colour)
    depth.set_ylabel("jobs in\nthe queue")
    depth.legend(loc="upper left", fontsize=7, ncol=3)
    _line(pickup, samples, _db_at("pickup_p99_seconds"), color="tab:red")
    pickup.set_ylabel("p99 pickup\n(s, log)")
    pickup.set_yscale("log")
    labels = sorted({label for s in samples for label in s.get("rss_mib", {})})
    for label in labels:
        style = {"color": "black", "linewidth": 1.5} if label.startswith("api") else {"alpha": 0.8}
        _line(rss, samples, _rss_of(label), **style)
    rss.set_ylabel("RSS MiB\n(per process)")
    rss.text(0.01, 0.9, "black: API; one line per worker pid", transform=rss.transAxes, fontsize=7)
    _line(connections, samples, _db_at("connections", "total"), color="tab:green")
    connections.set_ylabel("open\nconnections")
    tables = [t for t in SHOWN_TABLES if any(t in (_db(s, "tables") or {}) for s in samples)]
    for table in tables:
        # The audit trail is the soak's instrument, not pgqueue's: it grows by design.
        label = f"{table} (the soak's audit)" if table == "job_audit" else table
        _line(sizes, samples, _db_at("tables", table, "table_mib"), label=label)
        _line(
            sizes,
            samples,
            _db_at("tables", table, "index_mib"),
            linestyle="--",
            color=sizes.lines[-1].get_color(),
        )
        _line(dead, samples, _db_at("tables", table, "dead_tuples"), label=label)
    sizes.set_ylabel("MiB (solid: table,\ndashed: indexes)")
    sizes.legend(loc="upper left", fontsize=7, ncol=3)
    dead.set_ylabel("dead tuples\n(reset by a crash)")
    dead.legend(loc="upper left", fontsize=7, ncol=3)


def _mark_faults(axes_list: Sequence[Axes], faults: list[dict[str, Any]]) -> list[Patch]:
    seen: dict[str, str] = {}
    for fault in faults:
        colour = FAULT_COLOURS.get(fault["kind"], "tab:gray")
        seen[fault["kind"]] = colour
        start, end = fault["start_elapsed_seconds"] / 60, fault["end_elapsed_seconds"] / 60
        for axes in axes_list:
            # A fault of a second would be invisible as a span: at least a visible sliver.
            axes.axvspan(start, max(end, start + 0.15), color=colour, alpha=0.25, linewidth=0)
    return [Patch(color=colour, alpha=0.5, label=kind) for kind, colour in seen.items()]


def plot_soak(document: dict[str, Any], path: Path) -> Path:
    """Draw ``document``'s samples and faults into ``path`` (PNG); return the path."""
    samples = sorted(document["samples"], key=lambda s: s["elapsed_seconds"])
    figure, axes_list = subplots(7, 1, figsize=(11, 15), sharex=True)
    _panels(axes_list, samples)
    legend = _mark_faults(axes_list, document["faults"])
    for axes in axes_list:
        axes.grid(True, alpha=0.3)
        # After this line the producers have stopped and the queue drains.
        axes.axvline(document["parameters"]["minutes"], color="black", linestyle=":")
    axes_list[-1].set_xlabel("minutes (dotted line: producers stop, the queue drains)")
    verdict = document.get("verdict", {})
    outcome = "passed" if verdict.get("passed") else f"FAILED: {', '.join(verdict['failed'])}"
    figure.suptitle(
        f"Soak: {document['parameters']['minutes']:g} minutes, {len(document['faults'])} faults; "
        f"verdict {outcome}\n{machine_note(document)}",
        fontsize=11,
    )
    if legend:
        figure.legend(
            handles=legend,
            loc="upper center",
            ncol=len(legend),
            fontsize=8,
            bbox_to_anchor=(0.5, 0.955),
            title="faults (shaded)",
            title_fontsize=8,
        )
    return save(figure, path, dpi=90, rect=(0, 0, 1, 0.93))
