"""The enqueue driver's summary: the spread of each case's figures over its verified
runs, the ratios and bounds the producer path is held to, each with whether it holds,
and the lines the command prints for a run, a ratio and a bound. It reads only the
runs: no server.
"""

from __future__ import annotations

from typing import Any

from pgqueue_bench import results

# The comparisons the producer path is held to: (numerator, denominator, at least);
# None: a reference shown beside them, held to nothing.
RATIOS: tuple[tuple[str, str, float | None], ...] = (
    ("enqueue-1", "raw-insert-1", 0.9),
    ("enqueue-1", "pgqueuer-single", 1.5),
    ("enqueue-16", "raw-insert-16", 0.8),
    # What a pool's checkout and return per row cost the same INSERT: held against no
    # bound, shown beside the ratios above.
    ("raw-insert-1-pool", "raw-insert-1", None),
    ("raw-insert-16-pool", "raw-insert-16", None),
    ("enqueue-many", "raw-multirow", 0.8),
    ("enqueue-many", "pgqueuer-batch", 1.2),
)
# Figures held to a bound of their own: (case, figure, "min" or "max", bound). The
# POST /jobs bound is three times the 801 requests/s the API served, on the machine
# these targets were set on, while every enqueue still took the database-wide
# notification lock. Absolute figures: on another machine, read them beside the same
# run's raw SQL (raw-insert-16 for POST /jobs, raw-copy for POST /jobs/batch).
BOUNDS = (
    ("http-jobs", "requests_per_second", "min", 2403.0),
    ("http-jobs", "latency_p99_ms", "max", 50.0),
    ("http-batch", "jobs_per_second", "min", 40000.0),
)

SPREAD_FIGURES = (
    "jobs_per_second",
    "requests_per_second",
    "latency_p50_ms",
    "latency_p99_ms",
    "client_cpu_us_per_job",
    "server_cpu_us_per_job",
)


def summarize(runs: list[dict[str, Any]], skipped: dict[str, str]) -> dict[str, Any]:
    """Per case, the spread of each figure over the verified runs; the ratios of the
    medians and the bounds, each with whether it holds; and what was skipped."""
    cases: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(run["case"] for run in runs):
        counted = [run for run in runs if run["case"] == name and run["verified"]]
        cases[name] = {
            figure: results.spread(run[figure] for run in counted)
            for figure in SPREAD_FIGURES
            if any(figure in run for run in runs if run["case"] == name)
        }
        cases[name]["runs_not_counted"] = sum(
            1 for run in runs if run["case"] == name and not run["verified"]
        )

    def median(case: str, figure: str = "jobs_per_second") -> float | None:
        found: float | None = cases.get(case, {}).get(figure, {}).get("median")
        return found

    def per_repeat(case: str) -> dict[int, float]:
        return {
            run["repeat"]: run["jobs_per_second"]
            for run in runs
            if run["case"] == case
            and run["verified"]
            and run.get("jobs_per_second")
            and "repeat" in run
        }

    ratios = []
    for numerator, denominator, at_least in RATIOS:
        top, bottom = median(numerator), median(denominator)
        value = top / bottom if top and bottom else None
        # The cases of one repeat ran in turn, minutes apart at most: the ratio of each
        # repeat's pair, whose spread says how far the machine's noise moves the ratio.
        tops, bottoms = per_repeat(numerator), per_repeat(denominator)
        paired = [tops[r] / bottoms[r] for r in sorted(tops) if r in bottoms]
        ratios.append(
            {
                "numerator": numerator,
                "denominator": denominator,
                "ratio": value,
                "per_repeat": results.spread(paired) if paired else None,
                "at_least": at_least,
                "holds": None if value is None or at_least is None else value >= at_least,
            }
        )
    bounds = []
    for case, figure, kind, bound in BOUNDS:
        value = median(case, figure)
        holds = None if value is None else (value >= bound if kind == "min" else value <= bound)
        bounds.append({"case": case, "figure": figure, "kind": kind, "bound": bound,
                       "median": value, "holds": holds})  # fmt: skip
    return {"cases": cases, "ratios": ratios, "bounds": bounds, "skipped": skipped}


def describe_run(run: dict[str, Any]) -> str:
    """The line the command prints for a run: its rate (over HTTP also requests and
    latency), its size and the load average, and why it does not count, or that it
    failed."""
    text = f"{run['case']:>22}: "
    if "error" in run:
        return text + f"FAILED: {run['error']}"
    text += f"{run['jobs_per_second'] or 0:,.0f} jobs/s"
    if "requests_per_second" in run:
        text += (
            f", {run['requests_per_second'] or 0:,.0f} req/s, p50 {run['latency_p50_ms']:.1f} ms, "
            f"p99 {run['latency_p99_ms']:.1f} ms"
        )
    text += f" ({run['jobs']:,} jobs in {run['seconds']:.2f} s, load {run['load_average_1m']})"
    return text + ("" if run["verified"] else f"; NOT counted: {'; '.join(run['problems'])}")


def describe_ratio(ratio: dict[str, Any]) -> str:
    """The line the command prints for a ratio of medians: its value, the least it
    may be, and whether it holds."""
    value = ratio["ratio"]
    shown = "-" if value is None else f"{value:.2f}x"
    spread = ratio.get("per_repeat")
    if spread and spread.get("min") is not None:
        shown += f" (per repeat {spread['min']:.2f}-{spread['max']:.2f}x)"
    line = f"{ratio['numerator']} / {ratio['denominator']}: {shown}"
    if ratio["at_least"] is None:
        return line
    verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[ratio["holds"]]
    return f"{line} (at least {ratio['at_least']:g}x: {verdict})"


def describe_bound(bound: dict[str, Any]) -> str:
    """The line the command prints for a bound: the median, the bound, and whether
    it holds."""
    value = bound["median"]
    shown = "-" if value is None else f"{value:,.1f}"
    sign = ">=" if bound["kind"] == "min" else "<="
    verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[bound["holds"]]
    return f"{bound['case']} {bound['figure']}: {shown} ({sign} {bound['bound']:,g}: {verdict})"
