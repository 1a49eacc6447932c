"""The soak's verdict, computed from its data alone: each item with its measured value,
its bound, and whether it held.

- Nothing lost and nothing completed twice, from the audit trail against the
  producers' acknowledged enqueues and the workers' logged acks (redeliveries, which
  at-least-once allows, are counted beside them, not judged).
- Flat resources: the least-squares slope, after a warm-up, of each worker's and API
  process's resident memory, and of the open connections, under a bound per hour. A
  leak of a few hundred bytes per job, or of a connection per fault, breaks them.
- Bounded tables: ``active_jobs`` (waiting, queued and running jobs only) stays small,
  and the history, pruned to the retention, stops growing once it is full.
- Recovery: after each fault, a sample window whose throughput is back to a fraction
  of the median of the windows before the fault, within a bound and before the next
  fault begins.

Everything here is pure (lists of dicts in, dicts out), so it is unit-tested without a
database (``tests/unit/test_soak_verdict.py``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

HOUR = 3600.0


@dataclass(frozen=True)
class Bounds:
    """What the verdict holds a run to; recorded in the results beside the figures."""

    warmup_seconds: float
    rss_mib_per_hour: float
    connections_per_hour: float
    active_jobs_mib: float
    history_growth_share: float
    """Once full, the history may grow at most at this share of its filling rate."""
    recovery_seconds: float
    recovery_share: float
    pre_fault_seconds: float
    min_points: int
    note: str

    @classmethod
    def for_minutes(cls, minutes: float) -> Bounds:
        """The hour's bounds, or looser ones for a run of less than 30 minutes, whose
        few minutes of samples cannot pin a slope down as tightly."""
        if minutes >= 30:
            return cls(
                warmup_seconds=600,
                rss_mib_per_hour=20,
                connections_per_hour=20,
                active_jobs_mib=8,
                history_growth_share=0.25,
                recovery_seconds=60,
                recovery_share=0.8,
                pre_fault_seconds=60,
                min_points=20,
                note=(
                    "an hour's bounds: 10 minutes of warm-up, then slopes over 50 minutes; "
                    "a leak of 350 bytes per job (at about 60,000 jobs an hour) breaks the RSS "
                    "bound, one connection leaked per fault (about 28 an hour) the connection "
                    "bound, which the pools' own elasticity (the API's 1-4, each worker's "
                    "pool of 2) cannot reach"
                ),
            )
        return cls(
            warmup_seconds=60,
            rss_mib_per_hour=240,
            connections_per_hour=600,
            active_jobs_mib=8,
            history_growth_share=0.5,
            recovery_seconds=20,
            recovery_share=0.8,
            pre_fault_seconds=30,
            min_points=6,
            note=(
                "a short run's looser bounds: slopes over two minutes only catch gross leaks "
                "(4 MiB a minute per process, 10 connections a minute)"
            ),
        )


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, value) points, per hour; None for fewer
    than two points or no spread in time."""
    if len(points) < 2:
        return None
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return slope * HOUR


def _item(
    name: str, value: Any, bound: str, passed: bool | None, detail: Any = None
) -> dict[str, Any]:
    return {"name": name, "value": value, "bound": bound, "passed": passed, "detail": detail}


def _database_samples(samples: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in samples if s.get("missing") is None]


def rss_slopes(samples: Sequence[dict[str, Any]], bounds: Bounds) -> dict[str, Any]:
    """Per process (label), the RSS slope after its own warm-up (a replacement worker
    starts later and warms up too), or None when too few points remain."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for sample in samples:
        for label, mib in sample.get("rss_mib", {}).items():
            series[label].append((sample["elapsed_seconds"], mib))
    slopes: dict[str, Any] = {}
    for label, points in series.items():
        first = points[0][0]
        warm = [(x, y) for x, y in points if x >= max(first, 0) + bounds.warmup_seconds]
        value = slope_per_hour(warm) if len(warm) >= bounds.min_points else None
        slopes[label] = None if value is None else round(value, 3)
    return slopes


def table_series(samples: Sequence[dict[str, Any]], table: str) -> list[tuple[float, float]]:
    """(seconds, table + index MiB) of one table over the samples that measured it."""
    return [
        (s["elapsed_seconds"], s["tables"][table]["table_mib"] + s["tables"][table]["index_mib"])
        for s in _database_samples(samples)
        if table in s.get("tables", {})
    ]


def fault_recovery(
    samples: Sequence[dict[str, Any]],
    fault: dict[str, Any],
    next_start: float | None,
    bounds: Bounds,
    run_end: float | None = None,
) -> dict[str, Any]:
    """How long after ``fault`` ended the throughput was back to ``recovery_share`` of
    the median of the windows in the ``pre_fault_seconds`` before it began.

    ``recovered`` is None when there is no pre-fault level to compare with (a fault right
    at the start, or one while an earlier one still held the queue down) or the workload stopped (``run_end``) before the bound was up, False
    when no window reached the level within the bound, or before the next fault began
    (``next_start``), True otherwise."""
    start, end = fault["start_elapsed_seconds"], fault["end_elapsed_seconds"]
    measured = [s for s in _database_samples(samples) if s.get("throughput_per_second") is not None]
    before = [
        s["throughput_per_second"]
        for s in measured
        if s["elapsed_seconds"] <= start
        and s["elapsed_seconds"] - (s["window_seconds"] or 0) >= start - bounds.pre_fault_seconds
    ]
    result: dict[str, Any] = {"kind": fault["kind"], "pre_fault_per_second": None}
    level = statistics.median(before) if before else 0.0
    if level <= 0:
        # Nothing to fall back to: the run had just begun, or an earlier fault still held.
        return result | {"recovered": None, "recovery_seconds": None, "why": "no throughput before"}
    result["pre_fault_per_second"] = round(level, 3)
    deadline = end + bounds.recovery_seconds
    if next_start is not None:
        deadline = min(deadline, next_start)
    if run_end is not None:
        deadline = min(deadline, run_end)
    for sample in measured:
        at = sample["elapsed_seconds"]
        if at <= end:
            continue
        if at > deadline:
            break
        if sample["throughput_per_second"] >= bounds.recovery_share * level:
            return result | {"recovered": True, "recovery_seconds": round(at - end, 3)}
    judged_until = end + bounds.recovery_seconds
    if next_start is not None:
        judged_until = min(judged_until, next_start)
    if run_end is not None and run_end < judged_until:
        return result | {"recovered": None, "recovery_seconds": None, "why": "the run ended"}
    cut_short = next_start is not None and next_start < end + bounds.recovery_seconds
    why = "the next fault began first" if cut_short else "not within the bound"
    return result | {"recovered": False, "recovery_seconds": None, "why": why}


def recoveries(
    samples: Sequence[dict[str, Any]],
    faults: Sequence[dict[str, Any]],
    bounds: Bounds,
    run_end: float | None = None,
) -> list[dict[str, Any]]:
    """:func:`fault_recovery` of every fault, in order."""
    found = []
    for n, fault in enumerate(faults):
        following = faults[n + 1]["start_elapsed_seconds"] if n + 1 < len(faults) else None
        found.append(fault_recovery(samples, fault, following, bounds, run_end))
    return found


def _slope_item(name: str, slopes: dict[str, Any], bound: float, unit: str) -> dict[str, Any]:
    judged = {label: value for label, value in slopes.items() if value is not None}
    if not judged:
        return _item(name, None, f"< {bound:g} {unit}", None, "too few samples after warm-up")
    worst = max(judged.values())
    return _item(name, worst, f"< {bound:g} {unit}", worst < bound, slopes)


def resource_items(samples: Sequence[dict[str, Any]], bounds: Bounds) -> list[dict[str, Any]]:
    """Flat memory and connections; bounded active_jobs and history."""
    database = _database_samples(samples)
    connections = [
        (s["elapsed_seconds"], s["connections"]["total"])
        for s in database
        if s["elapsed_seconds"] >= bounds.warmup_seconds
    ]
    connection_slope = (
        slope_per_hour(connections) if len(connections) >= bounds.min_points else None
    )
    active = [(x, y) for x, y in table_series(samples, "active_jobs") if x >= bounds.warmup_seconds]
    active_max = max((y for _, y in active), default=None)
    return [
        _slope_item("rss_slope", rss_slopes(samples, bounds), bounds.rss_mib_per_hour, "MiB/hour"),
        _slope_item(
            "connections_slope",
            {"total": None if connection_slope is None else round(connection_slope, 3)},
            bounds.connections_per_hour,
            "connections/hour",
        ),
        _item(
            "active_jobs_size",
            None if active_max is None else round(active_max, 3),
            f"<= {bounds.active_jobs_mib:g} MiB (table and indexes, after warm-up)",
            None if active_max is None else active_max <= bounds.active_jobs_mib,
        ),
    ]


def history_item(
    samples: Sequence[dict[str, Any]], bounds: Bounds, retention_seconds: float, prune_every: float
) -> dict[str, Any]:
    """The history stops growing once full: its slope after the retention (and a
    pruning round more) is at most ``history_growth_share`` of its filling slope."""
    series = table_series(samples, "finished_jobs")
    full_from = retention_seconds + 2 * prune_every
    filling = [(x, y) for x, y in series if x <= retention_seconds]
    full = [(x, y) for x, y in series if x >= full_from]
    bound = f"<= {bounds.history_growth_share:g} x its filling slope (MiB/hour)"
    fill, steady = slope_per_hour(filling), slope_per_hour(full)
    if len(full) < bounds.min_points or fill is None or steady is None or fill <= 0:
        return _item("history_size", None, bound, None, "too few samples once the history is full")
    detail = {"filling_mib_per_hour": round(fill, 3), "full_mib_per_hour": round(steady, 3)}
    return _item(
        "history_size",
        round(steady, 3),
        bound,
        steady <= bounds.history_growth_share * fill,
        detail,
    )


def recovery_item(found: list[dict[str, Any]], bounds: Bounds) -> dict[str, Any]:
    """Every fault that could be judged recovered; per kind, the slowest recovery."""
    by_kind: dict[str, dict[str, Any]] = {}
    for entry in found:
        kind = by_kind.setdefault(entry["kind"], {"faults": 0, "recovered": 0, "slowest": None})
        kind["faults"] += 1
        if entry["recovered"]:
            kind["recovered"] += 1
            slowest = kind["slowest"]
            seconds = entry["recovery_seconds"]
            kind["slowest"] = seconds if slowest is None else max(slowest, seconds)
    failed = [entry for entry in found if entry["recovered"] is False]
    judged = [entry for entry in found if entry["recovered"] is not None]
    bound = (
        f"{bounds.recovery_share:.0%} of the pre-fault throughput within "
        f"{bounds.recovery_seconds:g} s"
    )
    passed = None if not judged else not failed
    return _item("recovery", f"{len(judged) - len(failed)}/{len(judged)}", bound, passed, by_kind)


def verdict(items: list[dict[str, Any]], bounds: Bounds) -> dict[str, Any]:
    """The whole verdict: passed when every judged item passed and none could not be
    judged that must be (the audit items always are)."""
    failed = [item["name"] for item in items if item["passed"] is False]
    return {
        "passed": not failed,
        "failed": failed,
        "not_judged": [item["name"] for item in items if item["passed"] is None],
        "items": items,
        "bounds": asdict(bounds),
    }


def describe(item: dict[str, Any]) -> str:
    """One line for a verdict item, as the command prints it."""
    mark = {True: "ok", False: "FAILED", None: "not judged"}[item["passed"]]
    return f"{mark:>10}  {item['name']}: {item['value']} (bound {item['bound']})"
