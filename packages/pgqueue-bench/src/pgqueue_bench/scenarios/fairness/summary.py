"""The fairness driver's summary: per phase, the spread over repeats of the rate and of
each tenant's pickup percentiles; the ratios between phases, paired within each repeat
(the phases take turns inside a repeat, so a pair shares the machine's mood); and the
targets fair share is held to, each with whether it holds. It reads only the runs: no
server.
"""

from __future__ import annotations

from typing import Any

from pgqueue_bench import results

ALONE = "alone"
FIFO = "fifo"
FAIR_SHARE = "fair-share"
PARTITION_LIMIT = "partition-limit"
PHASES = (ALONE, FIFO, FAIR_SHARE, PARTITION_LIMIT)
CONTENDED_PHASES = (FIFO, FAIR_SHARE, PARTITION_LIMIT)

BIG_TENANT = "big"
# The small tenants' jobs together, beside each small tenant's own figures.
SMALL_TENANTS = "small tenants"
PERCENTILES = ("p50", "p99")

# Fair share keeps each small tenant's p99 pickup within this multiple of its p99
# alone...
P99_OVER_ALONE_AT_MOST = 2.0
# ...and drains at this fraction of FIFO's rate or better.
RATE_OVER_FIFO_AT_LEAST = 0.9


# Each figure of a tenant: the pickup (to the claim) and the time to the handler's start.
LATENCY = "latency_ms"
TO_HANDLER_START = "to_handler_start_ms"


def _p99(run: dict[str, Any], tenant: str, figure: str = LATENCY) -> float | None:
    entry = run["small_tenants"] if tenant == SMALL_TENANTS else run["tenants"].get(tenant)
    if entry is None or figure not in entry:
        return None
    p99: float = entry[figure]["p99"]
    return p99


def _spreads(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The spread of each percentile of the pickup, and of the time to the handler's
    start as ``to_handler_start``, over one tenant's entries in the runs."""
    return {
        **{p: results.spread(entry[LATENCY][p] for entry in entries) for p in PERCENTILES},
        "to_handler_start": {
            p: results.spread(
                entry[TO_HANDLER_START][p] for entry in entries if TO_HANDLER_START in entry
            )
            for p in PERCENTILES
        },
    }


def _phase_spreads(runs: list[dict[str, Any]]) -> dict[str, Any]:
    tenants = list(dict.fromkeys(tenant for run in runs for tenant in run["tenants"]))
    return {
        "jobs_per_second": results.spread(run["jobs_per_second"] for run in runs),
        "tenants": {
            tenant: _spreads([run["tenants"][tenant] for run in runs if tenant in run["tenants"]])
            for tenant in tenants
        },
        SMALL_TENANTS: _spreads([run["small_tenants"] for run in runs]),
    }


def _paired(runs: list[dict[str, Any]], phase: str, baseline: str, value: Any) -> list[float]:
    """``value(run)`` of ``phase``'s run over the ``baseline`` phase's, per repeat in
    which both were verified and measured it."""
    by_repeat = {(run["repeat"], run["phase"]): run for run in runs if run["verified"]}
    ratios = []
    for (repeat, name), run in by_repeat.items():
        other = by_repeat.get((repeat, baseline))
        if name != phase or other is None:
            continue
        top, bottom = value(run), value(other)
        if top is not None and bottom:
            ratios.append(top / bottom)
    return ratios


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The spreads per phase over the verified runs, the paired ratios, and the
    targets (see :data:`P99_OVER_ALONE_AT_MOST` and :data:`RATE_OVER_FIFO_AT_LEAST`)."""
    counted = [run for run in runs if run["verified"]]
    present = list(dict.fromkeys(run["phase"] for run in runs))
    small = [
        tenant
        for tenant in dict.fromkeys(t for run in runs for t in run["tenants"])
        if tenant != BIG_TENANT
    ]
    phases = {
        phase: {
            **_phase_spreads([run for run in counted if run["phase"] == phase]),
            "runs_not_counted": sum(1 for r in runs if r["phase"] == phase and not r["verified"]),
        }
        for phase in present
    }
    contended = [phase for phase in CONTENDED_PHASES if phase in present]
    p99_over_alone = {
        phase: {
            tenant: results.spread(
                _paired(runs, phase, ALONE, lambda run, tenant=tenant: _p99(run, tenant))
            )
            for tenant in [*small, SMALL_TENANTS]
        }
        for phase in contended
        if ALONE in present
    }
    # The same for the small tenants together, to the handler's start.
    start_p99_over_alone = {
        phase: results.spread(
            _paired(runs, phase, ALONE, lambda run: _p99(run, SMALL_TENANTS, TO_HANDLER_START))
        )
        for phase in contended
        if ALONE in present
    }
    rate_over_fifo = {
        phase: results.spread(_paired(runs, phase, FIFO, lambda run: run["jobs_per_second"]))
        for phase in contended
        if phase != FIFO and FIFO in present
    }
    worst: float | None = None
    fair_p99 = p99_over_alone.get(FAIR_SHARE, {})
    medians = [fair_p99.get(tenant, {}).get("median") for tenant in small]
    if medians and all(median is not None for median in medians):
        worst = max(m for m in medians if m is not None)
    fair_rate = rate_over_fifo.get(FAIR_SHARE, {}).get("median")
    targets = [
        {
            "name": "every small tenant's p99 pickup with fair share / its p99 alone "
            "(the worst tenant's median per-repeat ratio)",
            "phase": FAIR_SHARE,
            "ratio": worst,
            "at_most": P99_OVER_ALONE_AT_MOST,
            "holds": None if worst is None else worst <= P99_OVER_ALONE_AT_MOST,
        },
        {
            "name": "jobs/s with fair share / jobs/s FIFO (median per-repeat ratio)",
            "phase": FAIR_SHARE,
            "ratio": fair_rate,
            "at_least": RATE_OVER_FIFO_AT_LEAST,
            "holds": None if fair_rate is None else fair_rate >= RATE_OVER_FIFO_AT_LEAST,
        },
    ]
    return {
        "phases": phases,
        "p99_over_alone": p99_over_alone,
        "to_handler_start_p99_over_alone": start_p99_over_alone,
        "jobs_per_second_over_fifo": rate_over_fifo,
        "targets": targets,
        "runs_not_counted": len(runs) - len(counted),
    }


def describe_target(target: dict[str, Any]) -> str:
    """The line the command prints for a target: the ratio, its bound, and whether it
    holds."""
    value = target["ratio"]
    shown = "-" if value is None else f"{value:.2f}x"
    bound = (
        f"at most {target['at_most']:g}x"
        if "at_most" in target
        else f"at least {target['at_least']:g}x"
    )
    verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[target["holds"]]
    return f"{target['name']}: {shown} ({bound}: {verdict})"
