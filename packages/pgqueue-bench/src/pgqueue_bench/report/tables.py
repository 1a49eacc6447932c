"""The pieces every table of the results page is built from: numbers, a median with
its range, a Markdown table, runs grouped into a grid, and the hardware line under
each table.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any


def number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def median_range(values: list[float], digits: int = 0) -> str:
    """'1,234 (1,200-1,300)', or just the value for a single run."""
    if not values:
        return "-"
    median = statistics.median(values)
    if len(values) == 1:
        return number(median, digits)
    return f"{number(median, digits)} ({number(min(values), digits)}-{number(max(values), digits)})"


def hardware(document: dict[str, Any]) -> str:
    """One line: CPUs, memory, PostgreSQL and where it ran, and when."""
    env = document.get("environment", {})
    machine = env.get("machine", {})
    pg = env.get("postgresql", {})
    version = (pg.get("version") or "PostgreSQL ?").split(" on ")[0]
    settings = pg.get("settings", {})
    durability = ", ".join(
        f"{name}={settings[name]}" for name in ("synchronous_commit", "fsync") if name in settings
    )
    return (
        f"{machine.get('cpu_count')} CPUs ({machine.get('cpu_model')}), "
        f"{machine.get('memory_gib')} GiB, {version} ({pg.get('server')}; {durability}), "
        f"Python {machine.get('python')}, {document.get('created_at', '')[:10]}"
    )


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def grouped(
    runs: list[dict[str, Any]],
    row_key: str,
    column_key: str,
    value: Callable[[dict[str, Any]], Any],
) -> dict[Any, dict[Any, list[float]]]:
    grid: dict[Any, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run.get("verified", True) and value(run) is not None:
            grid[run[row_key]][run[column_key]].append(value(run))
    return grid
