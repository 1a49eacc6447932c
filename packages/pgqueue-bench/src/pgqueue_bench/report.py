"""Markdown tables of the results files, written into the README between markers.

The README's results section is generated, never typed: everything between
:data:`BEGIN_MARKER` and :data:`END_MARKER` is replaced by :func:`render`, which
states the hardware each table ran on.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from pgqueue_bench import results

BEGIN_MARKER = "<!-- results:begin -->"
END_MARKER = "<!-- results:end -->"


def _number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _median_range(values: list[float], digits: int = 0) -> str:
    """'1,234 (1,200-1,300)', or just the value for a single run."""
    if not values:
        return "-"
    median = statistics.median(values)
    if len(values) == 1:
        return _number(median, digits)
    return (
        f"{_number(median, digits)} ({_number(min(values), digits)}-{_number(max(values), digits)})"
    )


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


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _grouped(
    runs: list[dict[str, Any]], row_key: str, column_key: str, value: Callable[[dict], Any]
) -> dict[Any, dict[Any, list[float]]]:
    grid: dict[Any, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run.get("verified", True) and value(run) is not None:
            grid[run[row_key]][run[column_key]].append(value(run))
    return grid


def throughput_section(document: dict[str, Any]) -> list[str]:
    """Jobs/s by worker processes and claim mode."""
    grid = _grouped(document["runs"], "workers", "mode", lambda run: run["jobs_per_second"])
    modes = list(dict.fromkeys(run["mode"] for run in document["runs"]))
    rows = [
        [str(workers), *(_median_range(grid[workers].get(mode, [])) for mode in modes)]
        for workers in sorted(grid)
    ]
    ratios = [
        f"{statistics.median(row['for-update']) / statistics.median(row['skip-locked']):.2f}x "
        f"at {workers}"
        for workers, row in sorted(grid.items())
        if row.get("for-update") and row.get("skip-locked")
    ]
    if ratios:
        lines_ratio = [
            "Plain `FOR UPDATE` against `SKIP LOCKED`, one job per claim, by worker "
            f"processes: {', '.join(ratios)}.",
            "",
        ]
    else:
        lines_ratio = []
    cpus = document.get("environment", {}).get("machine", {}).get("cpu_count")
    lines = [
        "### Throughput (jobs/s, median and min-max over runs)",
        "",
        f"{document['parameters'].get('jobs')} pre-loaded no-op jobs, worker processes "
        "released together, first claim to last ack on the database clock.",
        "",
        *_table(["workers", *modes], rows),
        "",
        *lines_ratio,
    ]
    if cpus:
        lines += [
            f"This machine has {cpus} CPU cores, shared by the worker processes and "
            "PostgreSQL: past that many processes, more workers add contention, not "
            "capacity, so the curves flatten or fall instead of scaling.",
            "",
        ]
    return lines


def latency_section(document: dict[str, Any]) -> list[str]:
    """p50/p95/p99 pickup latency per wake-up mode."""
    by_mode: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in document["runs"]:
        for name in ("p50", "p95", "p99", "max"):
            by_mode[run["mode"]][name].append(run["latency_ms"][name])
    rows = [
        [mode, *(_median_range(values[name], 2) for name in ("p50", "p95", "p99", "max"))]
        for mode, values in by_mode.items()
    ]
    params = document["parameters"]
    return [
        "### Pickup latency (ms, median and min-max over runs)",
        "",
        f"{params.get('jobs')} no-op jobs enqueued at {params.get('rate'):g}/s, one per "
        f"transaction, {params.get('workers')} worker processes; first claim minus "
        "GREATEST(run_at, enqueued_at), on the database clock.",
        "",
        *_table(["wake-up", "p50", "p95", "p99", "max"], rows),
        "",
    ]


def peers_section(document: dict[str, Any]) -> list[str]:
    """Jobs/s of pgqueue and its peers side by side, and pgqueue's ratio."""
    throughput = [run for run in document["runs"] if run["scenario"] == "throughput"]
    grid = _grouped(throughput, "workers", "system", lambda run: run["jobs_per_second"])
    systems = list(dict.fromkeys(run["system"] for run in throughput))
    ratios = document["summary"].get("pgqueue_vs_fastest_peer", {})
    rows = []
    for workers in sorted(grid):
        ratio = ratios.get(str(workers))
        rows.append(
            [
                str(workers),
                *(_median_range(grid[workers].get(name, [])) for name in systems),
                f"{ratio['ratio']:.1f}x" if ratio else "-",
            ]
        )
    lines = [
        "### pgqueue and its peers (jobs/s, median and min-max over runs)",
        "",
        f"The same {document['parameters'].get('jobs')} no-op jobs, the same server, one "
        "run; a run counts only once every job completed exactly once.",
        "",
        *_table(["workers", *systems, "pgqueue / fastest peer"], rows),
        "",
    ]
    for name, how in document["parameters"].get("systems", {}).items():
        lines.append(f"- {name}: {how}")
    latency = document["summary"].get("latency", {})
    if latency:
        lines += [
            "",
            *_table(
                ["pickup latency (ms)", "p50", "p95", "p99"],
                [
                    [name, *(_number(values[p]["median"], 1) for p in ("p50", "p95", "p99"))]
                    for name, values in latency.items()
                ],
            ),
        ]
    return [*lines, ""]


CRASH_COLUMNS = (
    ("workers killed", "workers_killed", 0),
    ("holding a job", "killed_while_holding_a_job", 0),
    ("succeeded", "jobs_succeeded", 0),
    ("never delivered", "jobs_never_delivered", 0),
    ("duplicate deliveries", "duplicate_deliveries", 0),
    ("most deliveries of one job", "most_deliveries_of_one_job", 0),
    ("failed attempts", "failed_attempts_recorded", 0),
    ("wall time (s)", "wall_seconds", 1),
)


def crash_section(document: dict[str, Any]) -> list[str]:
    """One row per crash run."""
    params = document["parameters"]
    rows = [
        [str(n), *(_number(run[key], digits) for _, key, digits in CRASH_COLUMNS)]
        for n, run in enumerate(document["runs"], start=1)
    ]
    return [
        "### Crash: workers SIGKILLed while they work",
        "",
        f"{params.get('jobs')} jobs, {params.get('workers')} worker processes "
        f"(concurrency {params.get('concurrency')}), lease {params.get('lease_seconds'):g} s; "
        f"every {params.get('kill_interval'):g} s a random worker gets SIGKILL and a "
        "replacement starts. Each job commits a delivery row, then works 10-50 ms.",
        "",
        *_table(["run", *(title for title, _, _ in CRASH_COLUMNS)], rows),
        "",
    ]


def restart_section(document: dict[str, Any]) -> list[str]:
    """One row per restart run."""
    params = document["parameters"]
    rows = [
        [
            f"`-m {run['mode']}`" if run["mode"] != "restart-cmd" else "`--restart-cmd`",
            _number(run["seconds_to_accept_connections"], 2),
            _number(run["seconds_to_all_succeeded"], 1),
            f"{run['jobs_succeeded']}/{run['jobs']}",
            _number(run["handler_invocations"]),
            _number(run["delivery_rows"]),
            _number(run["failed_attempts_recorded"]),
        ]
        for run in document["runs"]
    ]
    return [
        "### Restart: PostgreSQL restarted under load",
        "",
        f"{params.get('jobs')} jobs, {params.get('workers')} worker processes, lease "
        f"{params.get('lease_seconds'):g} s; the server restarts once "
        f"{params.get('restart_at', 0) * 100:.0f}% of the jobs succeeded "
        f"({params.get('restart')}).",
        "",
        *_table(
            [
                "restart",
                "accepting again (s)",
                "all succeeded (s)",
                "succeeded",
                "handler invocations",
                "delivery rows",
                "failed attempts",
            ],
            rows,
        ),
        "",
    ]


SECTIONS = {
    "throughput": throughput_section,
    "latency": latency_section,
    "peers": peers_section,
    "crash": crash_section,
    "restart": restart_section,
}


def render(directory: Path | str | None = None) -> str:
    """The generated results section, from every results file there is."""
    lines = [
        "<!-- Generated by `pgqueue bench report` (nox -s docs) from results/*.json; "
        "do not edit by hand. -->",
        "",
    ]
    for name, section in SECTIONS.items():
        document = results.read(name, directory)
        if document is None or not document.get("runs"):
            continue
        lines += section(document)
        lines += [f"Ran on: {hardware(document)}. Raw data: `results/{name}.json`.", ""]
    return "\n".join(lines).rstrip() + "\n"


def replace_between_markers(text: str, generated: str) -> str:
    """``text`` with everything between the markers replaced by ``generated``."""
    start = text.find(BEGIN_MARKER)
    end = text.find(END_MARKER)
    if start < 0 or end < start:
        raise click.ClickException(
            f"the README needs the markers {BEGIN_MARKER} and {END_MARKER}, in that order"
        )
    return text[: start + len(BEGIN_MARKER)] + "\n" + generated + text[end:]


@click.command("report")
@click.option(
    "--readme",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Rewrite this file between the results markers (default: print the tables).",
)
@click.option("--check", is_flag=True, help="Only check that --readme is up to date.")
@click.option("--results-dir", type=click.Path(file_okay=False), help="Default: ./results.")
def report_command(readme: Path | None, check: bool, results_dir: str | None) -> None:
    """Render the README's results tables from results/*.json."""
    generated = render(results_dir)
    if readme is None:
        click.echo(generated, nl=False)
        return
    current = readme.read_text()
    updated = replace_between_markers(current, generated)
    if check:
        if updated != current:
            raise click.ClickException(f"{readme} is out of date: run `pgqueue bench report`")
        click.echo(f"{readme} is up to date")
        return
    if updated != current:
        readme.write_text(updated)
        click.echo(f"updated {readme}")
    else:
        click.echo(f"{readme} already up to date")
