"""The controls driver's summary: the most jobs running at once from their start and
finish, and the spread of every pause/resume figure beside the limits' runs. Pure
functions of the runs, so they are tested without a server.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pgqueue_bench import results


def most_at_once(intervals: Iterable[tuple[datetime, datetime | None]]) -> int:
    """The most intervals open at one instant; one without an end is open from its
    start on. An end and a start at the same instant do not overlap."""
    edges = []
    for started, ended in intervals:
        edges.append((started, 1))
        if ended is not None:
            edges.append((ended, -1))
    most = now = 0
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        now += step
        most = max(most, now)
    return most


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The spread over the pause/resume cycles of each figure, and the limits' runs."""
    cycles = [run for run in runs if run["scenario"] == "pause_resume"]
    summary: dict[str, Any] = {
        name: results.spread(cycle[name] for cycle in cycles)
        for name in (
            "pause_to_quiet_ms",
            "resume_to_first_start_ms",
            "starts_after_pause",
            "pause_command_ms",
            "resume_command_ms",
        )
    }
    for run in runs:
        if run["scenario"] == "concurrency_limit":
            summary["concurrency_limit"] = {
                "limit": run["limit"],
                "most_running": max(run["most_running_sampled"], run["most_running_from_jobs"]),
                "held": max(run["most_running_sampled"], run["most_running_from_jobs"])
                <= run["limit"],
                "jobs_per_second": run["jobs_per_second"],
            }
        elif run["scenario"] == "rate_limit":
            summary["rate_limit"] = {
                "limit": run["rate_limit"],
                "window_seconds": run["window_seconds"],
                "starts": run["starts"],
                "expected_starts": run["expected_starts"],
                "ratio_to_limit": run["ratio_to_limit"],
            }
    return summary
