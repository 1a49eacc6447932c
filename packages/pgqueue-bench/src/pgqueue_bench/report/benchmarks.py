"""The results page's sections of the speed benchmarks: throughput, pickup latency, the
peers side by side (and the async and baseline runs), the producer path (enqueue) and
the queue controls.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from pgqueue_bench.report.tables import grouped, median_range, number, table

# FOR UPDATE at this fraction of SKIP LOCKED's rate or better, at every worker count,
# is no measurable difference (the runs' spread is wider than that).
SKIP_LOCKED_NO_DIFFERENCE = 0.75
# The throughput driver's mode the worker's default drain is measured against, and the
# summary's entry of that ratio (see pgqueue_bench.scenarios.throughput.driver).
CEILING_MODE = "batched-ceiling"
CEILING_RATIO = f"ratio_to_{CEILING_MODE}"
# A run below this fraction of its mode's median at its worker count is no ordinary
# spread (a stall): the page names it.
STALLED_FRACTION = 0.25


def throughput_section(document: dict[str, Any]) -> list[str]:
    """Jobs/s by worker processes and claim mode."""
    grid = grouped(document["runs"], "workers", "mode", lambda run: run["jobs_per_second"])
    modes = list(dict.fromkeys(run["mode"] for run in document["runs"]))
    rows = [
        [str(workers), *(median_range(grid[workers].get(mode, [])) for mode in modes)]
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
    lines_ratio += _against_naive_loop(grid)
    lines_ratio += _against_ceiling(document.get("summary", {}))
    lines_ratio += _stalled(document["runs"], grid)
    lines_ratio += _cpu_per_job(document["runs"], modes)
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
        *table(["workers", *modes], rows),
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


def _against_naive_loop(grid: dict[Any, dict[str, list[float]]]) -> list[str]:
    """One job per claim (``skip-locked``) against the original design's naive loop."""
    compared = {
        workers: statistics.median(row["skip-locked"]) / statistics.median(row["naive-loop"])
        for workers, row in sorted(grid.items())
        if row.get("skip-locked") and row.get("naive-loop")
    }
    if not compared:
        return []
    ratios = ", ".join(f"{ratio:.2f}x at {workers}" for workers, ratio in compared.items())
    return [
        "One job per claim (`skip-locked`) against the original design's naive loop "
        "(`naive-loop`: its table, claim and ack, one job at a time, nothing else), by "
        f"processes: {ratios}. A pgqueue worker commits a job's ack with its next claim, "
        "one commit per job where the loop makes two, and runs the job on a thread of its "
        "own beside a heartbeat, a reaper and a listener, which cost CPU per job (below).",
        "",
    ]


def _against_ceiling(summary: dict[str, Any]) -> list[str]:
    """The default drain against the batched ceiling: the ratio of each round's pair."""
    by_workers = summary.get("default", {})
    compared = {
        int(workers): entry[CEILING_RATIO]
        for workers, entry in by_workers.items()
        if entry.get(CEILING_RATIO, {}).get("median") is not None
    }
    if not compared:
        return []
    ratios = ", ".join(
        f"{spread['median']:.2f}x"
        + (f" ({spread['min']:.2f}-{spread['max']:.2f})" if spread["runs"] > 1 else "")
        + f" at {workers}"
        for workers, spread in sorted(compared.items())
    )
    return [
        "The default drain against the batched ceiling (`batched-ceiling`: the original "
        "design's table and loop with 100 jobs per claim statement and 100 per ack "
        "statement, no lease, no heartbeat, no other thread), the ratio of the two runs of "
        f"each round, median (min-max over rounds), by processes: {ratios}.",
        "",
    ]


def _stalled(runs: list[dict[str, Any]], grid: dict[Any, dict[str, list[float]]]) -> list[str]:
    """The runs far slower than their mode's median at their worker count, named with
    their duration and CPU per job: a stall, which a median hides."""
    named = []
    for run in runs:
        rate = run.get("jobs_per_second")
        rates = grid.get(run["workers"], {}).get(run["mode"], [])
        if rate is None or len(rates) < 2 or rate >= STALLED_FRACTION * statistics.median(rates):
            continue
        cpu = ""
        if run.get("server_cpu_us_per_job") is not None:
            cpu = (
                f", {run['client_cpu_us_per_job']:,.0f} / {run['server_cpu_us_per_job']:,.0f} "
                "µs of CPU per job, workers / server"
            )
        retried = run.get("not_first_attempt_successes")
        named.append(
            f"{run['mode']}, {run['workers']} processes"
            + (f", round {run['repeat']}" if run.get("repeat") else "")
            + f": {run['jobs_per_second']:,.0f} jobs/s, {run['seconds']:.1f} s{cpu}"
            + (f", {retried} jobs not done at their first attempt" if retried else "")
        )
    if not named:
        return []
    return [
        f"Runs slower than {STALLED_FRACTION:g} of their median (stalls, not spread): "
        + "; ".join(named)
        + ".",
        "",
    ]


def _cpu_per_job(runs: list[dict[str, Any]], modes: list[str]) -> list[str]:
    """Median CPU per job, the worker processes' and the server's, by mode and workers."""
    grid: dict[int, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        clients, server = run.get("client_cpu_us_per_job"), run.get("server_cpu_us_per_job")
        if clients is not None and server is not None and run.get("verified", True):
            grid[run["workers"]][run["mode"]].append((clients, server))
    if not grid:
        return []

    def cell(values: list[tuple[float, float]]) -> str:
        if not values:
            return "-"
        clients = statistics.median(value[0] for value in values)
        server = statistics.median(value[1] for value in values)
        return f"{clients:,.0f} / {server:,.0f}"

    rows = [
        [str(workers), *(cell(grid[workers][mode]) for mode in modes)] for workers in sorted(grid)
    ]
    return [
        "CPU per job in µs, the worker processes' together / the server's (median), from "
        "the load to the last job's finish. On two shared cores, a rate that the cores "
        "bound is the inverse of their sum:",
        "",
        *table(["workers", *modes], rows),
        "",
    ]


def latency_section(document: dict[str, Any]) -> list[str]:
    """p50/p95/p99 pickup latency per wake-up mode."""
    by_mode: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in document["runs"]:
        for name in ("p50", "p95", "p99", "max"):
            by_mode[run["mode"]][name].append(run["latency_ms"][name])
    rows = [
        [mode, *(median_range(values[name], 2) for name in ("p50", "p95", "p99", "max"))]
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
        *table(["wake-up", "p50", "p95", "p99", "max"], rows),
        "",
    ]


def peers_section(document: dict[str, Any]) -> list[str]:
    """Jobs/s of pgqueue and its peers side by side, and pgqueue's ratio (no-op jobs, or
    with ``sleep_ms`` async jobs that await ``asyncio.sleep``)."""
    sleep_ms = document["parameters"].get("sleep_ms")
    throughput = [run for run in document["runs"] if run["scenario"] == "throughput"]
    grid = grouped(throughput, "workers", "system", lambda run: run["jobs_per_second"])
    systems = list(dict.fromkeys(run["system"] for run in throughput))
    ratios = document["summary"].get("pgqueue_vs_fastest_peer", {})
    rows = []
    for workers in sorted(grid):
        ratio = ratios.get(str(workers))
        rows.append(
            [
                str(workers),
                *(median_range(grid[workers].get(name, [])) for name in systems),
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
        *table(["workers", *systems, "pgqueue / fastest peer"], rows),
        "",
    ]
    for name, how in document["parameters"].get("systems", {}).items():
        lines.append(f"- {name}: {how}")
    latency = document["summary"].get("latency", {})
    if latency:
        lines += [
            "",
            *table(
                ["pickup latency (ms)", "p50", "p95", "p99"],
                [
                    [name, *(number(values[p]["median"], 1) for p in ("p50", "p95", "p99"))]
                    for name, values in latency.items()
                ],
            ),
        ]
    return [*lines, ""]


def _verdict(holds: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "not measured"}[holds]


def _ratio(ratio: dict[str, Any]) -> str:
    """A ratio of medians, with the spread of the ratios of each repeat's pair of runs
    when the results have it."""
    if ratio["ratio"] is None:
        return "-"
    spread = ratio.get("per_repeat") or {}
    if spread.get("min") is None:
        return f"{ratio['ratio']:.2f}x"
    return f"{ratio['ratio']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f})"


def enqueue_section(document: dict[str, Any]) -> list[str]:
    """Jobs/s per enqueue case (HTTP also requests/s and latency), then the ratios and
    bounds the producer path is held to, then what was not measured and why."""
    params = document["parameters"]
    labels = params.get("cases", {})
    counted = [run for run in document["runs"] if run.get("verified")]

    def figures(case: str, figure: str, digits: int = 0) -> str:
        return median_range([run[figure] for run in counted if run["case"] == case], digits)

    def cpu(case: str, figure: str) -> str:
        values = [run[figure] for run in counted if run["case"] == case and figure in run]
        return median_range(values, 1) if values else "-"

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
                cpu(case, "client_cpu_us_per_job"),
                cpu(case, "server_cpu_us_per_job"),
            ]
        )
    summary = document["summary"]
    checks = [
        [
            f"`{r['numerator']}` / `{r['denominator']}`",
            _ratio(r),
            "reference" if r["at_least"] is None else f"at least {r['at_least']:g}x",
            "-" if r["at_least"] is None else _verdict(r["holds"]),
        ]
        for r in summary.get("ratios", [])
    ]
    checks += [
        [
            f"`{b['case']}` {b['figure'].replace('_', ' ')}",
            # One decimal: a median just under its bound must not read as equal to it.
            number(b["median"], 1),
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
        "on the same machine; latency is per request. CPU per job (cases run in the "
        "bench's own process): the CPU time of that process (client) and of the whole "
        "PostgreSQL server (server) over the measured window, divided by the jobs added; "
        f"the two share the machine's cores.{load}",
        "",
        *table(
            [
                "case",
                "what",
                "jobs/s",
                "requests/s",
                "p50 ms",
                "p99 ms",
                "client CPU µs/job",
                "server CPU µs/job",
            ],
            rows,
        ),
        "",
        "A comparison is the ratio of the two cases' medians; in brackets, the lowest "
        "and highest ratio of the two within one run (the cases of a run take turns, so "
        "each pair ran minutes apart at most). The `-pool` cases take a connection from a "
        "psycopg_pool pool per row: what the pool's checkout and return alone cost.",
        "",
        *table(["comparison (medians)", "value", "target", "holds"], checks),
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


def baseline_section(document: dict[str, Any]) -> list[str]:
    """Drain throughput of this build against an earlier one, paired per repeat in one
    run: what a change costs the path every job takes."""
    baseline = document["summary"]["vs_baseline"]["baseline"]
    return paired_section(
        document,
        f"### This build against {baseline} (jobs/s, median and min-max over runs)",
        f"{document['parameters'].get('jobs')} no-op jobs drained as in the peers "
        "benchmark, every system in each repeat (in turn, each repeat starting with the "
        "next one); in parentheses, the median and min-max of the per-repeat ratios to "
        f"{baseline}.",
    )


def paired_section(document: dict[str, Any], heading: str, intro: str) -> list[str]:
    """The tables of a side-by-side run against a baseline system (its summary's
    ``vs_baseline``): jobs/s per worker count and system, each with its per-repeat ratios
    to the baseline, the systems' settings, then the same for CPU per job."""
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
                median_range(_spread_values(throughput[baseline].get(workers))),
                *(
                    f"{median_range(_spread_values(throughput[name].get(workers)))} "
                    f"({_ratio_range(ratios[workers].get(name))})"
                    for name in systems
                ),
            ]
        )
    described = document["parameters"].get("systems", {})
    lines = [heading, "", intro, "", *table(["workers", baseline, *systems], rows), ""]
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
            median_range(_spread_values(cpu[baseline].get(workers)), 1),
            *(
                f"{median_range(_spread_values(cpu[name].get(workers)), 1)} "
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
        *table(["workers", baseline, *systems], rows),
        "",
    ]


def _spread_values(spread: dict[str, Any] | None) -> list[float]:
    """A spread's median, min and max as values :func:`median_range` shows alike."""
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
            number(summary["pause_to_quiet_ms"]["median"], 1),
            f"{number(summary['pause_to_quiet_ms']['min'], 1)}-"
            f"{number(summary['pause_to_quiet_ms']['max'], 1)}",
        ],
        [
            "resume to the first start (ms)",
            number(summary["resume_to_first_start_ms"]["median"], 1),
            f"{number(summary['resume_to_first_start_ms']['min'], 1)}-"
            f"{number(summary['resume_to_first_start_ms']['max'], 1)}",
        ],
        [
            "jobs started after the pause (claimed ahead)",
            number(summary["starts_after_pause"]["median"]),
            f"{number(summary['starts_after_pause']['min'])}-"
            f"{number(summary['starts_after_pause']['max'])}",
        ],
    ]
    return [
        "### Queue controls: pause, resume and limits with real workers",
        "",
        f"{params.get('workers')} worker processes with {params.get('concurrency')} slots "
        f"each and the default poll interval, on {params.get('job_ms')} ms jobs; "
        f"{params.get('cycles')} pause and resume cycles.",
        "",
        *table(["", "median", "min-max"], rows),
        "",
        f"- Concurrency limit {limit['limit']} with {params.get('concurrency_workers')} "
        f"workers: at most {limit['most_running']} running at once "
        f"({'held' if limit['held'] else '**exceeded**'}).",
        f"- Rate limit {rate['limit']:g}/s: {rate['starts']} starts in "
        f"{rate['window_seconds']:g} s, against {rate['expected_starts']:g} expected "
        f"({rate['ratio_to_limit']:.2f} of the limit).",
        "",
    ]
