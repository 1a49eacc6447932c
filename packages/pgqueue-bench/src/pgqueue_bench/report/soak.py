"""The soak's section of the README's generated results (``pgqueue bench report``): what
ran, the faults injected, and the verdict, item by item with its bound, from
``results/soak.json``."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pgqueue_bench.report.tables import table

ITEM_TITLES = {
    "lost": "acknowledged jobs lost",
    "completed_twice": "jobs completed twice",
    "unfinished_after_drain": "jobs unfinished after the drain",
    "jobs_nobody_enqueued": "jobs no producer or schedule enqueued",
    "worker_evidence": "runs without the workers' evidence",
    "samples": "samples with database figures",
    "rss_slope": "RSS slope, worst process (MiB/hour)",
    "connections_slope": "open connections slope (per hour)",
    "active_jobs_size": "`active_jobs` size, largest (MiB)",
    "history_size": "history slope once full (MiB/hour)",
    "recovery": "faults recovered",
    "faults_injected": "faults injected",
    "errors": "errors, worker exits, undrained queue",
}


def _verdict_cell(passed: bool | None) -> str:
    return {True: "holds", False: "**fails**", None: "not judged"}[passed]


def _value(item: dict[str, Any]) -> str:
    value = item["value"]
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


def _faults_line(faults: list[dict[str, Any]], recoveries: list[dict[str, Any]]) -> str:
    counts = Counter(fault["kind"] for fault in faults)
    slowest: dict[str, float] = {}
    for entry in recoveries:
        if entry.get("recovered"):
            slowest[entry["kind"]] = max(slowest.get(entry["kind"], 0.0), entry["recovery_seconds"])
    parts = [
        f"{kind.replace('_', ' ')} {n}"
        + (f" (slowest recovery {slowest[kind]:.0f} s)" if kind in slowest else "")
        for kind, n in sorted(counts.items())
    ]
    return "; ".join(parts)


def soak_section(document: dict[str, Any]) -> list[str]:
    """The soak's parameters, faults and verdict table."""
    params = document["parameters"]
    workload = params["workload"]
    figures = document["audit"]
    verdict = document["verdict"]
    low, high = params["fault_every"]
    rows = [
        [
            ITEM_TITLES.get(item["name"], item["name"]),
            _value(item),
            str(item["bound"]).replace("|", "/"),
            _verdict_cell(item["passed"]),
        ]
        for item in verdict["items"]
    ]
    rate = workload["in_process_per_second"] + workload["api_per_second"]
    outcomes = ", ".join(f"{n:,} {state}" for state, n in sorted(figures["outcomes"].items()))
    return [
        "### Soak: an hour of chaos",
        "",
        f"{params['minutes']:g} minutes on a private cluster: {params['workers']} worker "
        f"processes plus one in a network namespace of its own ({params['concurrency']} slots "
        f"each, lease {params['lease_seconds']:g} s) and a `pgqueue-api`; {rate:g} jobs/s "
        "enqueued in-process and over HTTP, 1 ms to 2 s each (log-uniform), 5% failing, 1% "
        f"timing out, plus {workload['limited_per_second']:g}/s into a queue limited to "
        f"{workload['limited_concurrency']} at once, fan-in groups, cancels, retries and a "
        f"schedule every 5 s; history pruned to {workload['retention_seconds']:g} s. A random "
        f"fault every {low:g}-{high:g} s: {_faults_line(document['faults'], verdict['recoveries'])}. "
        f"Verdict: **{'passed' if verdict['passed'] else 'failed'}** ({verdict['bounds']['note']}).",
        "",
        *table(["check", "measured", "bound", "verdict"], rows),
        "",
        f"{figures['acknowledged_enqueues']:,} acknowledged enqueues ({outcomes}), "
        f"{figures['schedule_ticks']:,} schedule ticks; {figures['handler_runs']:,} handler runs "
        f"of which {figures['redeliveries']:,} repeated a job (at-least-once: "
        f"{figures['failed_attempts']:,} failed attempts, by the handler or reaped); "
        f"{figures['pruned_by_retention']:,} finished jobs pruned. `active_jobs` holds only "
        "waiting, queued and running jobs, so it stays small whatever the history; the "
        "history is bounded by the retention (the workers' own pruner drops whole UTC days, "
        "so within an hour only the soak's `Queue.prune` removes any). Plot: "
        "`results/soak.png`.",
        "",
    ]
