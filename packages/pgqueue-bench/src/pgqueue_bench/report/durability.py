"""The results page's sections of the durability runs: workers killed (crash), the
server restarted (restart), side effects under chaos (effects), the fault scenarios per
PostgreSQL version (faults) and the state-machine model test (model), with the footers
of the last two, whose documents say where they ran in their own way.
"""

from __future__ import annotations

import re
from typing import Any

from pgqueue_bench.report.tables import number, table

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
        [str(n), *(number(run[key], digits) for _, key, digits in CRASH_COLUMNS)]
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
        *table(["run", *(title for title, _, _ in CRASH_COLUMNS)], rows),
        "",
    ]


def restart_section(document: dict[str, Any]) -> list[str]:
    """One row per restart run."""
    params = document["parameters"]
    rows = [
        [
            f"`-m {run['mode']}`" if run["mode"] != "restart-cmd" else "`--restart-cmd`",
            number(run["seconds_to_accept_connections"], 2),
            number(run["seconds_to_all_succeeded"], 1),
            f"{run['jobs_succeeded']}/{run['jobs']}",
            number(run["handler_invocations"]),
            number(run["delivery_rows"]),
            number(run["failed_attempts_recorded"]),
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
        *table(
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


# The effects run's table: its rows (the fenced handler's two ways, then both handlers)
# and its columns, each a figure of handler_figures (pgqueue_bench.scenarios.effects.driver).
EFFECTS_ROWS = (
    ("fenced, `with job.transaction()`", ("fenced", "transaction")),
    ("fenced, `job.complete(conn)` on its own connection", ("fenced", "own_connection")),
    ("**fenced**, both ways", ("fenced", None)),
    ("**plain**: insert, then return", ("plain", None)),
)
EFFECTS_COLUMNS = (
    ("succeeded", "jobs_succeeded"),
    ("handler runs", "handler_runs"),
    ("rows", "rows"),
    ("missing", "missing"),
    ("duplicated", "duplicated"),
    ("jobs with duplicates", "jobs_duplicated"),
    ("completions refused", "completions_refused"),
)
EFFECTS_FAULTS = (
    ("worker_sigkill", "a worker SIGKILLed"),
    ("worker_sigstop", "a worker SIGSTOPped past its lease, then SIGCONTed"),
    ("terminate_backends", "`pg_terminate_backend` of every worker and handler connection"),
    ("server_crash", "`pg_ctl stop -m immediate`, then start"),
)


def effects_section(document: dict[str, Any]) -> list[str]:
    """The latest effects run: per handler (and per way of the fenced one), the rows
    its jobs left in the application table, then the faults it ran under."""
    params, run = document["parameters"], document["runs"][-1]
    summary = document.get("summary", {})
    rows = []
    for title, (handler, way) in EFFECTS_ROWS:
        figures = run["handlers"][handler]
        if way is not None:
            figures = figures.get("by_way", {}).get(way)
            if figures is None:
                continue
        succeeded = f"{_count(figures['jobs_succeeded'])}/{_count(figures['jobs'])}"
        rows.append([title, succeeded, *(_count(figures[key]) for _, key in EFFECTS_COLUMNS[1:])])
    injected = run.get("faults_injected", {})
    faults = "; ".join(f"{what}: {_count(injected.get(kind, 0))}" for kind, what in EFFECTS_FAULTS)
    low, high = params.get("work_ms", (0, 0))
    every_low, every_high = params.get("fault_every", (0, 0))
    verdict = "passed" if summary.get("passed") else "failed"
    return [
        f"### {EFFECTS_HEADING}",
        "",
        f"{params.get('jobs'):,} jobs per handler, interleaved on one queue, "
        f"{params.get('workers')} worker processes (concurrency {params.get('concurrency')}), "
        f"lease {params.get('lease_seconds'):g} s, on a private cluster. Each handler inserts "
        "a row into an application table without a unique constraint, then works "
        f"{low:g}-{high:g} ms: the **fenced** one in the transaction that completes its job, "
        "fenced by the attempt's lease (half its jobs each way); the **plain** one in a "
        "transaction of its own, then returns and the worker acks. Until every job had "
        f"finished, a fault every {every_low:g}-{every_high:g} s, in rounds of the four in a "
        f"random order ({faults}). **missing**: jobs without a row; **duplicated**: rows "
        "beyond the first of each job; **completions refused**: `job.complete` calls that "
        "raised `LeaseLost` (the attempt had lost its lease) and rolled their row back.",
        "",
        *table(["handler", *(title for title, _ in EFFECTS_COLUMNS)], rows),
        "",
        f"Verdict: {verdict}. Jobs completed twice in the audit trail: "
        f"{_count(run.get('completed_twice'))}. From every worker serving to the last job's "
        f"finish: {number(run.get('wall_seconds'), 1)} s, with "
        f"{_count(run.get('workers_started'))} worker processes started in all "
        "(`pgqueue bench effects`).",
        "",
    ]


EFFECTS_HEADING = "Side effects: exactly once when the handler completes in its transaction"


def effects_readme(document: dict[str, Any] | None) -> str:
    """The README's sentence of the latest effects run's figures, under its guarantees
    (empty without a run): both handlers' rows, missing and duplicated, and the faults."""
    if not document or not document.get("runs"):
        return ""
    params, run = document["parameters"], document["runs"][-1]
    fenced, plain = run["handlers"]["fenced"], run["handlers"]["plain"]
    pg = document.get("environment", {}).get("postgresql", {})
    version = (pg.get("version") or "PostgreSQL ?").split(" on ")[0]
    injected = run.get("faults_injected", {})
    faults = "; ".join(f"{what}: {_count(injected.get(kind, 0))}" for kind, what in EFFECTS_FAULTS)
    anchor = re.sub(r"[^\w\- ]", "", EFFECTS_HEADING.lower()).replace(" ", "-")
    return (
        f"Measured (`pgqueue bench effects`, {version} on a private cluster, "
        f"{document.get('created_at', '')[:10]}): {params.get('jobs'):,} jobs of each of two "
        f"handlers, interleaved, under {_count(sum(injected.values()))} faults while they "
        f"ran ({faults}). The handler that writes its row and completes its job in the same "
        f"transaction left {_count(fenced['rows'])} rows for its "
        f"{_count(fenced['jobs_succeeded'])} succeeded jobs: **{_count(fenced['missing'])} "
        f"missing, {_count(fenced['duplicated'])} duplicated** "
        f"({_count(fenced['completions_refused'])} stale completions refused with "
        "`LeaseLost`, their rows rolled back). The handler that writes, then returns, left "
        f"{_count(plain['rows'])} rows for its {_count(plain['jobs_succeeded'])}: "
        f"{_count(plain['missing'])} missing, {_count(plain['duplicated'])} duplicated "
        f"([figures](results/README.md#{anchor}), `results/effects.json`).\n"
    )


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


def fault_versions(document: dict[str, Any]) -> list[dict[str, Any]]:
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
    versions = fault_versions(document)
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
        *table(header, rows),
        "",
    ]


def faults_footer(document: dict[str, Any]) -> str:
    """The faults' 'Ran on' line: the machine, every version's clusters, and the run."""
    machine = document.get("environment", {}).get("machine", {})
    versions = fault_versions(document)
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


# The model's rule that completes jobs in a holder's own transaction (tests/model).
COMPLETION_RULE = "complete_pending"


def model_versions(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The model document's per-version runs, newest major first."""
    versions = document.get("postgresql") or {}
    return [
        (major, versions[major])
        for major in sorted(versions, key=lambda major: int(major), reverse=True)
        if "steps" in versions[major]
    ]


def model_section(document: dict[str, Any]) -> list[str]:
    """One row per PostgreSQL version the state-machine model ran on, under what it
    drives: the completions in a holder's own transaction only if the recorded runs
    had that rule (a run of an older model did not)."""
    rows = [
        [
            f"PostgreSQL {major}",
            f"{run['seconds'] / 60:.0f} min",
            _count(run["examples"]),
            _count(run["steps"]),
            _count(run["invariant_checks"]),
            _count(run["failures"]),
        ]
        for major, run in model_versions(document)
    ]
    completed = all(
        run.get("rules", {}).get(COMPLETION_RULE) for _, run in model_versions(document)
    )
    completions = (
        "completions with an application row in the holder's own transaction "
        "(`job.complete`), raced by lease expiry, the reaper and the other worker, "
        if completed
        else ""
    )
    rows_checked = (
        ", one application row per job completed in a committed transaction" if completed else ""
    )
    return [
        "### The state machine against its model",
        "",
        "Hypothesis drives the real queue on real PostgreSQL through random sequences of "
        "enqueues of every kind (idempotency and unique keys, dependency graphs, batches), "
        "through the pool or inside a caller's own transaction that commits or rolls back, "
        "claims by two workers, heartbeats, acks and failures (current and stale leases), "
        f"{completions}lease expiry, reaping, cancels and their cascades, retries that wait for "
        "dependencies, pauses, concurrency and rate limits, schedules' ticks, pruning "
        "across the history's days and rows Python cannot decode, and compares every job "
        "and every count with a model after each step, with nothing run before its "
        f"dependencies succeeded{rows_checked} and timestamps in the order of events "
        "(`tests/model`, `nox -s model`).",
        "",
        *table(["server", "ran", "examples", "steps", "invariant checks", "failures"], rows),
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
