"""Markdown tables of the results files, and the command that keeps every generated
part of the documentation current.

The results page (``results/README.md``) is generated, never typed: everything between
:data:`BEGIN_MARKER` and :data:`END_MARKER` is replaced by :func:`render`, which
states the hardware each table ran on. ``pgqueue bench report`` also writes the
command-line reference (:mod:`pgqueue_bench.cli_reference`) into ``docs/cli.md``. The benchmarks' documents hold ``runs``; the
fault scenarios' (``results/faults.json``) hold, per PostgreSQL major version, one entry
per scenario.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from pgqueue_bench import cli_reference, results
from pgqueue_bench.soak_report import soak_section

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


# FOR UPDATE at this fraction of SKIP LOCKED's rate or better, at every worker count,
# is no measurable difference (the runs' spread is wider than that).
SKIP_LOCKED_NO_DIFFERENCE = 0.75


def throughput_section(document: dict[str, Any]) -> list[str]:
    """Jobs/s by worker processes and claim mode."""
    grid = _grouped(document["runs"], "workers", "mode", lambda run: run["jobs_per_second"])
    modes = list(dict.fromkeys(run["mode"] for run in document["runs"]))
    rows = [
        [str(workers), *(_median_range(grid[workers].get(mode, [])) for mode in modes)]
        for workers in sorted(grid)
    ]
    compared = {
        workers: statistics.median(row["for-update"]) / statistics.median(row["skip-locked"])
        for workers, row in sorted(grid.items())
        if row.get("for-update") and row.get("skip-locked")
    }
    lines_ratio = []
    if compared:
        ratios = ", ".join(f"{ratio:.2f}x at {workers}" for workers, ratio in compared.items())
        lines_ratio = [
            "Plain `FOR UPDATE` against `SKIP LOCKED`, one job per claim, by worker "
            f"processes: {ratios}.",
            "",
        ]
        if min(compared.values()) >= SKIP_LOCKED_NO_DIFFERENCE:
            one_job_rate = max(
                statistics.median(row[mode])
                for row in grid.values()
                for mode in ("for-update", "skip-locked")
                if row.get(mode)
            )
            lines_ratio += [
                "Here plain `FOR UPDATE` costs little, unlike in designs that hold "
                "a claimed row's lock while the job runs. A pgqueue claim is one short "
                "transaction: the lease, not the row lock, keeps the job, so a claimer "
                "waits only for another claim's commit, and at the most one-job claims "
                f"per second reached here ({one_job_rate:,.0f}) they rarely meet. "
                "`SKIP LOCKED` matters as claims become frequent enough to queue on the "
                "same rows, which this machine does not reach.",
                "",
            ]
    short_runs = [
        run["seconds"] for run in document["runs"] if run.get("seconds") and run["seconds"] < 1
    ]
    if short_runs:
        lines_ratio += [
            f"The shortest run lasted {min(short_runs):.2f} s. Runs under a second are "
            "easily disturbed by anything else the machine does; "
            "`pgqueue bench throughput --jobs N` makes every run longer.",
            "",
        ]
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
    """Jobs/s of pgqueue and its peers side by side, and pgqueue's ratio (no-op jobs, or
    with ``sleep_ms`` async jobs that await ``asyncio.sleep``)."""
    sleep_ms = document["parameters"].get("sleep_ms")
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
        f"### pgqueue and its peers{f', {sleep_ms:g} ms async jobs' if sleep_ms else ''} "
        "(jobs/s, median and min-max over runs)",
        "",
        f"The same {document['parameters'].get('jobs')} "
        + (
            f"jobs whose handler, in every system, awaits `asyncio.sleep({sleep_ms / 1000:g})`"
            if sleep_ms
            else "no-op jobs"
        )
        + ", the same server, one run; a run counts only once every job completed exactly once.",
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


def _verdict(holds: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "not measured"}[holds]


def enqueue_section(document: dict[str, Any]) -> list[str]:
    """Jobs/s per enqueue case (HTTP also requests/s and latency), then the ratios and
    bounds the producer path is held to, then what was not measured and why."""
    params = document["parameters"]
    labels = params.get("cases", {})
    counted = [run for run in document["runs"] if run.get("verified")]

    def figures(case: str, figure: str, digits: int = 0) -> str:
        return _median_range([run[figure] for run in counted if run["case"] == case], digits)

    rows = []
    for case in labels:
        if not any(run["case"] == case for run in document["runs"]):
            continue
        http = any("requests_per_second" in run for run in counted if run["case"] == case)
        rows.append(
            [
                f"`{case}`",
                labels[case],
                figures(case, "jobs_per_second"),
                figures(case, "requests_per_second") if http else "-",
                figures(case, "latency_p50_ms", 1) if http else "-",
                figures(case, "latency_p99_ms", 1) if http else "-",
            ]
        )
    summary = document["summary"]
    checks = [
        [
            f"`{r['numerator']}` / `{r['denominator']}`",
            "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
            f"at least {r['at_least']:g}x",
            _verdict(r["holds"]),
        ]
        for r in summary.get("ratios", [])
    ]
    checks += [
        [
            f"`{b['case']}` {b['figure'].replace('_', ' ')}",
            # One decimal: a median just under its bound must not read as equal to it.
            _number(b["median"], 1),
            f"{'at least' if b['kind'] == 'min' else 'at most'} {b['bound']:,g}",
            _verdict(b["holds"]),
        ]
        for b in summary.get("bounds", [])
    ]
    repeats = params.get("repeats")
    loads = [run["load_average_1m"] for run in document["runs"] if "load_average_1m" in run]
    load = (
        f" The machine's 1-minute load average at the runs' ends: {min(loads):g}-{max(loads):g}."
        if loads
        else ""
    )
    lines = [
        "### Enqueue: the producer path (median and min-max over runs)",
        "",
        f"Every case on the same server in one run, {repeats} run{'s' if repeats != 1 else ''} each, "
        f"{params.get('seconds'):g} s per run after a {params.get('warmup'):g} s warm-up, "
        "on a fresh schema (the peers: a fresh database). Raw SQL writes into a table "
        "created `LIKE` active_jobs (same columns, defaults, constraints and indexes, "
        "no triggers). Rates are jobs per second of the client's wall clock; a run counts "
        "only if the table then holds every job it counted. HTTP load comes from `wrk` "
        f"on the same machine; latency is per request.{load}",
        "",
        *_table(["case", "what", "jobs/s", "requests/s", "p50 ms", "p99 ms"], rows),
        "",
        *_table(["comparison (medians)", "value", "target", "holds"], checks),
        "",
    ]
    skipped = summary.get("skipped", {})
    if skipped:
        lines += [
            "Not measured: "
            + "; ".join(f"{labels.get(case, case)}: {reason}" for case, reason in skipped.items())
            + ".",
            "",
        ]
    return lines


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


# The figures every fault scenario reports (tests/faults/fault_support.py, Verdict.figures);
# whatever else a scenario recorded is its own, listed under "also measured".
FAULT_COMMON_FIGURES = frozenset(
    {
        "jobs",
        "lost",
        "duplicates",
        "redeliveries",
        "handler_runs",
        "failed_attempts",
        "pause_seconds",
        "recovery_seconds",
    }
)
# What a scenario entry says about itself rather than what it measured.
FAULT_BOOKKEEPING = frozenset({"test", "recorded_at", "fault"})
# PGQUEUE_FAULTS_DEADLOCK_SECONDS in the noxfile's faults session.
FAULTS_SESSION_HUNT_SECONDS = 60.0


def _fault_versions(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The faults document's per-version entries that hold scenarios, newest major first."""
    versions = document.get("postgresql") or {}
    return [
        versions[major]
        for major in sorted(versions, key=lambda major: int(major), reverse=True)
        if versions[major].get("scenarios")
    ]


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _figure(value: Any) -> str:
    """A scenario-specific figure as the table shows it: yes/no, k=v, or the number."""
    if isinstance(value, bool):  # before int: a bool is an int
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{key}={_figure(item)}" for key, item in value.items())
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    return "-" if value is None else str(value)


def _cell(text: str | None) -> str:
    """Free text from a results file as a table cell: a '|' would split the cell."""
    return text.replace("|", "\\|") if text else "-"


def _outcome_cells(scenario: dict[str, Any] | None) -> list[str]:
    """'jobs · lost · duplicates · redelivered' and 'recovery (pause)' for one version."""
    if scenario is None:  # this version did not run the scenario
        return ["-", "-"]
    counts = " · ".join(
        _count(scenario.get(key)) for key in ("jobs", "lost", "duplicates", "redeliveries")
    )
    recovery, pause = scenario.get("recovery_seconds"), scenario.get("pause_seconds")
    if recovery is None and pause is None:
        timing = "-"
    else:
        timing = f"{_seconds(recovery)} ({_seconds(pause)})"
    return [counts, timing]


def _also_measured(scenario: dict[str, Any]) -> str:
    """The scenario's own figures, 'name value' separated by semicolons."""
    return "; ".join(
        f"{name.replace('_', ' ')} {_figure(value)}"
        for name, value in scenario.items()
        if name not in FAULT_COMMON_FIGURES | FAULT_BOOKKEEPING
    )


def faults_section(document: dict[str, Any]) -> list[str]:
    """One row per fault scenario: what it broke and, per PostgreSQL version, what was
    lost, duplicated and redelivered, and how long the queue took to recover."""
    versions = _fault_versions(document)
    keys = sorted({key for entry in versions for key in entry["scenarios"]})
    header = ["#", "fault"]
    for entry in versions:
        version = entry.get("version", "PostgreSQL ?")
        header += [
            f"{version}: jobs · lost · duplicates · redelivered",
            f"{version.removeprefix('PostgreSQL ')}: recovery (pause) s",
        ]
    # Scenario-specific figures differ in kind from row to row; one version's are enough
    # to show what else a scenario checks, and the header says whose they are.
    newest_version = versions[0].get("version", "PostgreSQL ?") if versions else ""
    header.append(f"also measured ({newest_version.removeprefix('PostgreSQL ')})")
    rows = []
    for key in keys:
        number, _, _ = key.partition("-")
        # The fault line and the extra figures come from the newest version that ran it.
        newest = next(entry["scenarios"][key] for entry in versions if key in entry["scenarios"])
        row = [str(int(number)) if number.isdigit() else number, _cell(newest.get("fault"))]
        for entry in versions:
            row += _outcome_cells(entry["scenarios"].get(key))
        row.append(_cell(_also_measured(newest)))
        rows.append(row)
    return [
        "### Fault injection: nothing lost",
        "",
        "Each scenario breaks something under load on a private cluster, then removes the "
        "fault. **lost**: acknowledged enqueues missing or not finished as expected; "
        "**duplicates**: jobs completed twice; **redelivered**: handler runs beyond the "
        "first, which at-least-once allows; **recovery**: seconds on the database clock "
        "from the fault's removal to the first finished job; **pause**: the longest gap "
        "between two finished jobs. What each row means: "
        "[docs/failure-modes.md](../docs/failure-modes.md).",
        "",
        *_table(header, rows),
        "",
    ]


def faults_footer(document: dict[str, Any]) -> str:
    """The faults' 'Ran on' line: the machine, every version's clusters, and the run."""
    machine = document.get("environment", {}).get("machine", {})
    versions = _fault_versions(document)
    servers = " and ".join(
        f"{entry.get('version', 'PostgreSQL ?')} ({entry.get('server', 'private clusters')})"
        for entry in versions
    )
    hunts = sorted(
        {
            entry["scenarios"]["08-deadlock-hunt"]["seconds"]
            for entry in versions
            if "seconds" in entry["scenarios"].get("08-deadlock-hunt", {})
        }
    )
    # `nox -s tests` runs the same scenarios with a shorter deadlock hunt: the line says
    # which run the figures are from, as the document records it.
    if all(seconds == FAULTS_SESSION_HUNT_SECONDS for seconds in hunts):
        source = f"`python3 -m nox -s faults` ({FAULTS_SESSION_HUNT_SECONDS:g} s deadlock hunt)"
    else:
        ran = " and ".join(_figure(seconds) for seconds in hunts)
        source = (
            f"`tests/faults` with a {ran} s deadlock hunt (`python3 -m nox -s faults` "
            f"hunts for {FAULTS_SESSION_HUNT_SECONDS:g} s)"
        )
    return (
        f"Ran on: {machine.get('cpu_count')} CPUs ({machine.get('cpu_model')}), "
        f"{machine.get('memory_gib')} GiB, {servers}, Python {machine.get('python')}, "
        f"{document.get('created_at', '')[:10]}; figures from {source}. "
        "Raw data: `results/faults.json`."
    )


def _model_versions(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The model document's per-version runs, newest major first."""
    versions = document.get("postgresql") or {}
    return [
        (major, versions[major])
        for major in sorted(versions, key=lambda major: int(major), reverse=True)
        if "steps" in versions[major]
    ]


def model_section(document: dict[str, Any]) -> list[str]:
    """One row per PostgreSQL version the state-machine model ran on."""
    rows = [
        [
            f"PostgreSQL {major}",
            f"{run['seconds'] / 60:.0f} min",
            _count(run["examples"]),
            _count(run["steps"]),
            _count(run["invariant_checks"]),
            _count(run["failures"]),
        ]
        for major, run in _model_versions(document)
    ]
    return [
        "### The state machine against its model",
        "",
        "Hypothesis drives the real queue on real PostgreSQL through random sequences of "
        "enqueues (with idempotency and unique keys, and jobs that wait for others), "
        "claims by two workers, heartbeats, acks and failures (current and "
        "stale leases), lease expiry, reaping, cancels, retries, pruning, pauses and "
        "concurrency limits, and compares every job and every count with a model after "
        "each step (`tests/model`, `nox -s model`).",
        "",
        *_table(["server", "ran", "examples", "steps", "invariant checks", "failures"], rows),
        "",
    ]


def model_footer(document: dict[str, Any]) -> str:
    """The model's 'Ran on' line: the machine and the run."""
    machine = document.get("environment", {}).get("machine", {})
    return (
        f"Ran on: {machine.get('cpu_count')} CPUs ({machine.get('cpu_model')}), "
        f"{machine.get('memory_gib')} GiB, Python {machine.get('python')}, "
        f"{document.get('created_at', '')[:10]}. Raw data: `results/model.json`."
    )


def baseline_section(document: dict[str, Any]) -> list[str]:
    """Drain throughput of this build against an earlier one, paired per repeat in one
    run: what a change costs the path every job takes."""
    summary = document["summary"]
    baseline = summary["vs_baseline"]["baseline"]
    ratios = summary["vs_baseline"]["ratios"]
    throughput = summary["throughput"]
    systems = [name for name in throughput if name != baseline]
    rows = []
    for workers in sorted(ratios, key=int):
        rows.append(
            [
                workers,
                _median_range(_spread_values(throughput[baseline].get(workers))),
                *(
                    f"{_median_range(_spread_values(throughput[name].get(workers)))} "
                    f"({_ratio_range(ratios[workers].get(name))})"
                    for name in systems
                ),
            ]
        )
    described = document["parameters"].get("systems", {})
    lines = [
        f"### This build against {baseline} (jobs/s, median and min-max over runs)",
        "",
        f"{document['parameters'].get('jobs')} no-op jobs drained as in the peers "
        "benchmark, every system in each repeat (in turn, each repeat starting with the "
        "next one); in parentheses, the median and min-max of the per-repeat ratios to "
        f"{baseline}.",
        "",
        *_table(["workers", baseline, *systems], rows),
        "",
    ]
    lines += [f"- {name}: {described[name]}" for name in [baseline, *systems] if name in described]
    return [*lines, "", *_baseline_cpu_lines(document, baseline, systems)]


def _baseline_cpu_lines(document: dict[str, Any], baseline: str, systems: list[str]) -> list[str]:
    """The same runs' CPU per job (worker processes and server), which the machine's
    other work moves far less than a rate; nothing for a file from before it was
    measured."""
    summary = document["summary"]
    ratios = summary["vs_baseline"].get("cpu_per_job_ratios")
    cpu = summary.get("cpu_us_per_job")
    if not ratios or not cpu:
        return []
    rows = [
        [
            workers,
            _median_range(_spread_values(cpu[baseline].get(workers)), 1),
            *(
                f"{_median_range(_spread_values(cpu[name].get(workers)), 1)} "
                f"({_ratio_range(ratios[workers].get(name))})"
                for name in systems
            ),
        ]
        for workers in sorted(ratios, key=int)
    ]
    return [
        f"CPU per job in the same runs (microseconds, worker processes and server together, "
        f"from the start barrier until the workers' backends are gone); in parentheses, the "
        f"median and min-max of the per-repeat ratios to {baseline}: above 1 costs more.",
        "",
        *_table(["workers", baseline, *systems], rows),
        "",
    ]


def _spread_values(spread: dict[str, Any] | None) -> list[float]:
    """A spread's median, min and max as values :func:`_median_range` shows alike."""
    if not spread:
        return []
    return [spread["min"], spread["median"], spread["max"]]


def _ratio_range(spread: dict[str, Any] | None) -> str:
    if not spread:
        return "-"
    return f"{spread['median']:.2f}x, {spread['min']:.2f}-{spread['max']:.2f}"


def controls_section(document: dict[str, Any]) -> list[str]:
    """How promptly real workers obey a pause, a resume and the limits."""
    summary = document["summary"]
    params = document["parameters"]
    limit = summary["concurrency_limit"]
    rate = summary["rate_limit"]
    rows = [
        [
            "pause to the last start after it (ms)",
            _number(summary["pause_to_quiet_ms"]["median"], 1),
            f"{_number(summary['pause_to_quiet_ms']['min'], 1)}-"
            f"{_number(summary['pause_to_quiet_ms']['max'], 1)}",
        ],
        [
            "resume to the first start (ms)",
            _number(summary["resume_to_first_start_ms"]["median"], 1),
            f"{_number(summary['resume_to_first_start_ms']['min'], 1)}-"
            f"{_number(summary['resume_to_first_start_ms']['max'], 1)}",
        ],
        [
            "jobs started after the pause (claimed ahead)",
            _number(summary["starts_after_pause"]["median"]),
            f"{_number(summary['starts_after_pause']['min'])}-"
            f"{_number(summary['starts_after_pause']['max'])}",
        ],
    ]
    return [
        "### Queue controls: pause, resume and limits with real workers",
        "",
        f"{params.get('workers')} worker processes with {params.get('concurrency')} slots "
        f"each and the default poll interval, on {params.get('job_ms')} ms jobs; "
        f"{params.get('cycles')} pause and resume cycles.",
        "",
        *_table(["", "median", "min-max"], rows),
        "",
        f"- Concurrency limit {limit['limit']} with {params.get('concurrency_workers')} "
        f"workers: at most {limit['most_running']} running at once "
        f"({'held' if limit['held'] else '**exceeded**'}).",
        f"- Rate limit {rate['limit']:g}/s: {rate['starts']} starts in "
        f"{rate['window_seconds']:g} s, against {rate['expected_starts']:g} expected "
        f"({rate['ratio_to_limit']:.2f} of the limit).",
        "",
    ]


SECTIONS = {
    "throughput": throughput_section,
    "latency": latency_section,
    "peers": peers_section,
    "peers_async": peers_section,
    "peers_baseline": baseline_section,
    "enqueue": enqueue_section,
    "crash": crash_section,
    "restart": restart_section,
    "controls": controls_section,
    "faults": faults_section,
    "model": model_section,
    "soak": soak_section,
}

# Sections whose document does not fit :func:`hardware` (one server, in "environment")
# write their own "Ran on" line.
FOOTERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "faults": faults_footer,
    "model": model_footer,
}


def has_figures(document: dict[str, Any] | None) -> bool:
    """Whether a results document holds anything to show: runs (the benchmarks), per
    PostgreSQL version, scenarios (the faults) or a run of the model, or the soak's
    samples."""
    if not document:
        return False
    return (
        bool(document.get("runs"))
        or bool(_fault_versions(document))
        or bool(_model_versions(document))
        or bool(document.get("samples"))
    )


def render(directory: Path | str | None = None) -> str:
    """The generated results section, from every results file there is."""
    lines = [
        "<!-- Generated by `pgqueue bench report` (nox -s docs) from results/*.json; "
        "do not edit by hand. -->",
        "",
    ]
    for name, section in SECTIONS.items():
        document = results.read(name, directory)
        if document is None or not has_figures(document):
            continue
        lines += section(document)
        if name in FOOTERS:
            lines += [FOOTERS[name](document), ""]
        else:
            lines += [f"Ran on: {hardware(document)}. Raw data: `results/{name}.json`.", ""]
    return "\n".join(lines).rstrip() + "\n"


def replace_between_markers(
    text: str, generated: str, begin: str = BEGIN_MARKER, end: str = END_MARKER
) -> str:
    """``text`` with everything between the markers replaced by ``generated``."""
    start = text.find(begin)
    stop = text.find(end)
    if start < 0 or stop < start:
        raise click.ClickException(f"the page needs the markers {begin} and {end}, in that order")
    return text[: start + len(begin)] + "\n" + generated + text[stop:]


@click.command("report")
@click.option(
    "--results-page",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("results/README.md"),
    show_default=True,
    help="The page whose results markers get the results tables.",
)
@click.option(
    "--cli-page",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("docs/cli.md"),
    show_default=True,
    help="The page whose cli markers get the command-line reference.",
)
@click.option("--check", is_flag=True, help="Only check that both pages are up to date.")
@click.option("--results-dir", type=click.Path(file_okay=False), help="Default: ./results.")
def report_command(
    results_page: Path, cli_page: Path, check: bool, results_dir: str | None
) -> None:
    """Regenerate the documentation's generated parts: the results tables, from
    results/*.json, and the command-line reference, from the commands themselves.
    Run it from the repository's root."""
    pages = [
        (results_page, render(results_dir), BEGIN_MARKER, END_MARKER),
        (cli_page, cli_reference.render(), cli_reference.BEGIN_MARKER, cli_reference.END_MARKER),
    ]
    stale = []
    for page, generated, begin, end in pages:
        if not page.is_file():
            raise click.ClickException(
                f"{page} does not exist: run this from the repository's root"
            )
        current = page.read_text()
        updated = replace_between_markers(current, generated, begin, end)
        if updated == current:
            click.echo(f"{page} is up to date")
        elif check:
            stale.append(str(page))
        else:
            page.write_text(updated)
            click.echo(f"updated {page}")
    if stale:
        raise click.ClickException(
            f"{', '.join(stale)} out of date: run `pgqueue bench report` (nox -s docs)"
        )
