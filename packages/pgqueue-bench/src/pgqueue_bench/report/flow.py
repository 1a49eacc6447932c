"""The results page's sections of flow control: a noisy neighbour's backlog beside
small tenants (``pgqueue bench fairness``), and the drain with partition keys against
the drain without (``python -m pgqueue_bench.peers --keys``)."""

from __future__ import annotations

from typing import Any

from pgqueue_bench.report.benchmarks import paired_section
from pgqueue_bench.report.tables import number, table
from pgqueue_bench.scenarios.fairness.summary import (
    BIG_TENANT,
    CONTENDED_PHASES,
    SMALL_TENANTS,
)


def _verdict(holds: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "not measured"}[holds]


def _cell(spread: dict[str, Any] | None, digits: int = 0) -> str:
    """'12 (10-15)' from a spread, or its median alone for a single run."""
    if not spread or spread.get("median") is None:
        return "-"
    median = number(spread["median"], digits)
    if spread["runs"] == 1:
        return median
    return f"{median} ({number(spread['min'], digits)}-{number(spread['max'], digits)})"


def _ratio(spread: dict[str, Any] | None) -> str:
    if not spread or spread.get("median") is None:
        return "-"
    if spread["runs"] == 1:
        return f"{spread['median']:.2f}x"
    return f"{spread['median']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f})"


def fairness_section(document: dict[str, Any]) -> list[str]:
    """Per phase, the small tenants' and the large tenant's pickup and the rate; each
    small tenant's p99 over its p99 alone; the targets, and whether they hold."""
    params = document["parameters"]
    summary = document["summary"]
    phases = summary["phases"]
    rows = []
    for phase, figures in phases.items():
        big = figures["tenants"].get(BIG_TENANT, {})
        small = figures[SMALL_TENANTS]
        rows.append(
            [
                f"`{phase}`",
                _cell(small["p50"], 1),
                _cell(small["p99"], 1),
                _cell(small.get("to_handler_start", {}).get("p99"), 1),
                _cell(big.get("p50")),
                _cell(big.get("p99")),
                _cell(figures["jobs_per_second"]),
            ]
        )
    lines = [
        "### Fairness: small tenants beside a large tenant's backlog "
        "(median and min-max over runs)",
        "",
        f"A large tenant enqueues {params.get('big_jobs'):,} jobs in one transaction; right "
        f"after, {params.get('small_tenants')} small tenants each enqueue jobs at "
        f"{params.get('small_rate'):g}/s, one per transaction, while the backlog has "
        f"unclaimed jobs (at most {params.get('small_jobs')}; alone, "
        f"{params.get('small_jobs')}). Every handler sleeps {params.get('job_ms'):g} ms; "
        f"{params.get('workers')} `pgqueue worker` processes with their default flags. "
        "Pickup is the claim minus GREATEST(run_at, enqueued_at), on the database clock; "
        "to handler start, the handler's own note of its start instead of the claim (a "
        "worker claims ahead what its free slots should start within 0.1 s). "
        "jobs/s counts every tenant's jobs, first start to last finish. Each phase runs on "
        "a fresh schema with fresh workers; the phases take turns within each repeat.",
        "",
        *table(
            [
                "phase",
                "small tenants p50 ms",
                "small tenants p99 ms",
                "small tenants p99 to handler start ms",
                "large tenant p50 ms",
                "large tenant p99 ms",
                "jobs/s",
            ],
            rows,
        ),
        "",
    ]
    described = [f"- `{phase}`: {how}" for phase, how in params.get("phases", {}).items()]
    lines += [*described, ""] if described else []
    lines += _small_tenant_ratios(summary)
    lines += _backlog_note(document["runs"])
    checks = [
        [
            target["name"],
            "-" if target["ratio"] is None else f"{target['ratio']:.2f}x",
            f"at most {target['at_most']:g}x"
            if "at_most" in target
            else f"at least {target['at_least']:g}x",
            _verdict(target["holds"]),
        ]
        for target in summary.get("targets", [])
    ]
    return [*lines, *table(["target", "value", "bound", "holds"], checks), ""]


def _small_tenant_ratios(summary: dict[str, Any]) -> list[str]:
    """Each small tenant's p99 in each contended phase over its p99 alone."""
    ratios = summary.get("p99_over_alone", {})
    phases = [phase for phase in CONTENDED_PHASES if phase in ratios]
    if not phases:
        return []
    tenants = list(ratios[phases[0]])
    rows = [
        [tenant, *(_ratio(ratios[phase].get(tenant)) for phase in phases)] for tenant in tenants
    ]
    to_start = summary.get("to_handler_start_p99_over_alone", {})
    if any(to_start.get(phase, {}).get("median") for phase in phases):
        rows.append(
            [
                f"{SMALL_TENANTS}, to handler start",
                *(_ratio(to_start.get(phase)) for phase in phases),
            ]
        )
    rate = summary.get("jobs_per_second_over_fifo", {})
    rows.append(["jobs/s over `fifo`", *(_ratio(rate.get(phase)) for phase in phases)])
    return [
        "p99 pickup over the same tenant's p99 alone, paired within each repeat (median "
        "and min-max of the per-repeat ratios), and the rate over FIFO's:",
        "",
        *table(["", *(f"`{phase}`" for phase in phases)], rows),
        "",
    ]


def _backlog_note(runs: list[dict[str, Any]]) -> list[str]:
    """How long the backlog lasted, what share of the small tenants' jobs met it, and
    how busy the machine was."""
    during = [
        run["small_jobs_enqueued_during_backlog"]
        for run in runs
        if run.get("small_jobs_enqueued_during_backlog") is not None
    ]
    seconds = [run["backlog_seconds"] for run in runs if run.get("backlog_seconds")]
    if not during or not seconds:
        return []
    loads = [run["load_average_1m"] for run in runs if "load_average_1m" in run]
    load = (
        f" The machine's 1-minute load average at the runs' ends: {min(loads):g}-{max(loads):g}."
        if loads
        else ""
    )
    return [
        f"The large tenant's jobs took {min(seconds):.1f}-{max(seconds):.1f} s to drain; "
        f"{min(during):.0%}-{max(during):.0%} of the small tenants' jobs were enqueued "
        f"before its last job started, so met the backlog.{load}",
        "",
    ]


def partitions_section(document: dict[str, Any]) -> list[str]:
    """The drain with partition keys against the drain without, paired per repeat, with
    the CPU per job and the target the keyed drain is held to."""
    params = document["parameters"]
    lines = paired_section(
        document,
        "### The drain with partition keys (jobs/s, median and min-max over runs)",
        f"{params.get('jobs')} no-op jobs drained as in the peers benchmark, without "
        f"partition keys and spread over {params.get('partition_keys')} keys, each "
        "system in each repeat (in turn, each repeat starting with the next one); in "
        "parentheses, the median and min-max of the per-repeat ratios to pgqueue without "
        "keys.",
    )
    checks = [
        [
            f"{target['system']}, {target['workers']} worker(s)",
            "-" if target["ratio"] is None else f"{target['ratio']:.2f}x",
            f"at least {target['at_least']:g}x",
            _verdict(target["holds"]),
        ]
        for target in document["summary"].get("targets", [])
    ]
    if checks:
        lines += [
            *table(["jobs/s over pgqueue without keys", "median", "target", "holds"], checks),
            "",
        ]
    return lines
