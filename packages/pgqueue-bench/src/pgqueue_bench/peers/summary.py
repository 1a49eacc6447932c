"""The summary of a side-by-side run: the spread of every figure per system and
worker count, pgqueue against the fastest peer, and with a baseline build, each pgqueue
system against it, paired within each repeat. Pure functions of the runs, so they are
tested without running any system.
"""

from __future__ import annotations

from typing import Any

from pgqueue_bench import results

# Jobs spread over partition keys drain at this fraction of the rate of the same jobs
# without keys or better, at every worker count (``--keys``).
KEYED_RATE_AT_LEAST = 0.8


def is_pgqueue(name: str) -> bool:
    """Whether the system called ``name`` is pgqueue (today's or a baseline), not a peer."""
    return name == "pgqueue" or name.startswith("pgqueue ")


def ratios_to_baseline(
    runs: list[dict[str, Any]], baseline: str, names: list[str], metric: str = "jobs_per_second"
) -> dict[str, dict[str, Any]]:
    """Per worker count and system of ``names``, its ``metric`` over ``baseline``'s,
    paired within each repeat (the systems take turns inside a repeat, so a pair
    shares the machine's mood): the spread of those ratios. Only repeats where both
    runs were verified and measured ``metric`` count."""
    values: dict[tuple[str, int, str], float] = {}
    for run in runs:
        if run["scenario"] == "throughput" and run["verified"] and run.get(metric):
            values[(str(run["workers"]), run["repeat"], run["system"])] = run[metric]
    out: dict[str, dict[str, Any]] = {}
    for workers, repeat, system in values:
        if system != baseline:
            continue
        for name in names:
            if name != baseline and (workers, repeat, name) in values:
                out.setdefault(workers, {}).setdefault(name, []).append(
                    values[(workers, repeat, name)] / values[(workers, repeat, baseline)]
                )
    return {
        workers: {name: results.spread(ratios) for name, ratios in by_name.items()}
        for workers, by_name in out.items()
    }


def summarize(
    runs: list[dict[str, Any]], names: list[str], baseline: str | None = None
) -> dict[str, Any]:
    """Spread per system and worker count over verified runs, pgqueue's ratio to the
    fastest peer at each worker count (medians), and with ``baseline``, every pgqueue
    system's ratio to it (see :func:`ratios_to_baseline`)."""
    counted = [run for run in runs if run["verified"]]
    throughput = spreads_by_workers(counted, names, "jobs_per_second")
    ratios = {}
    for workers, spread in throughput.get("pgqueue", {}).items():
        peers = {
            name: throughput[name][workers]["median"]
            for name in names
            if not is_pgqueue(name) and workers in throughput[name]
        }
        if peers and spread["median"]:
            fastest = max(peers, key=lambda name: peers[name])
            ratios[workers] = {
                "pgqueue": spread["median"],
                "fastest_peer": fastest,
                "fastest_peer_jobs_per_second": peers[fastest],
                "ratio": spread["median"] / peers[fastest],
            }
    latency = {}
    for name in names:
        chosen = [r for r in counted if r["scenario"] == "latency" and r["system"] == name]
        if chosen:
            latency[name] = {
                p: results.spread(r["latency_ms"][p] for r in chosen) for p in ("p50", "p95", "p99")
            }
    summary = {
        "throughput": throughput,
        "cpu_us_per_job": spreads_by_workers(counted, names, "cpu_us_per_job"),
        "pgqueue_vs_fastest_peer": ratios,
        "latency": latency,
        "runs_not_counted": len(runs) - len(counted),
    }
    if baseline:
        variants = [name for name in names if is_pgqueue(name) and name != baseline]
        summary["vs_baseline"] = {
            "baseline": baseline,
            "ratios": ratios_to_baseline(runs, baseline, variants),
            # Above 1: the system costs more CPU per job than the baseline.
            "cpu_per_job_ratios": ratios_to_baseline(runs, baseline, variants, "cpu_us_per_job"),
        }
    return summary


def spreads_by_workers(
    runs: list[dict[str, Any]], names: list[str], metric: str
) -> dict[str, dict[str, Any]]:
    """Per system of ``names`` and worker count, the spread of ``metric`` over the
    throughput runs of ``runs`` that measured it."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        by_workers: dict[str, list[float]] = {}
        for run in runs:
            if run["scenario"] == "throughput" and run["system"] == name and run.get(metric):
                by_workers.setdefault(str(run["workers"]), []).append(run[metric])
        out[name] = {w: results.spread(values) for w, values in by_workers.items()}
    return out


def keyed_targets(summary: dict[str, Any], keyed: list[str]) -> list[dict[str, Any]]:
    """For each system of ``keyed`` (jobs with partition keys) and worker count, its
    median per-repeat rate ratio to pgqueue without keys (the summary's baseline),
    against :data:`KEYED_RATE_AT_LEAST`, with whether it holds."""
    ratios = summary.get("vs_baseline", {}).get("ratios", {})
    targets = []
    for workers in sorted(ratios, key=int):
        for name in keyed:
            median = ratios[workers].get(name, {}).get("median")
            targets.append(
                {
                    "system": name,
                    "workers": int(workers),
                    "ratio": median,
                    "at_least": KEYED_RATE_AT_LEAST,
                    "holds": None if median is None else median >= KEYED_RATE_AT_LEAST,
                }
            )
    return targets


def print_summary(summary: dict[str, Any], baseline_name: str | None) -> None:
    """Print the summary's ratios: pgqueue's to the fastest peer, and with a baseline,
    each pgqueue system's rate and CPU per job over the baseline's."""
    for workers, ratio in summary["pgqueue_vs_fastest_peer"].items():
        print(
            f"{workers} workers: pgqueue {ratio['pgqueue']:,.0f} jobs/s, fastest peer "
            f"{ratio['fastest_peer']} {ratio['fastest_peer_jobs_per_second']:,.0f} jobs/s: "
            f"{ratio['ratio']:.2f}x"
        )
    for workers, by_name in summary.get("vs_baseline", {}).get("ratios", {}).items():
        for variant, ratio in by_name.items():
            print(
                f"{workers} workers: {variant} / {baseline_name}: {ratio['median']:.3f}x "
                f"(per repeat {ratio['min']:.3f}-{ratio['max']:.3f}, {ratio['runs']} repeats)"
            )
    for workers, by_name in summary.get("vs_baseline", {}).get("cpu_per_job_ratios", {}).items():
        for variant, ratio in by_name.items():
            print(
                f"{workers} workers: CPU per job, {variant} / {baseline_name}: "
                f"{ratio['median']:.3f}x (per repeat {ratio['min']:.3f}-{ratio['max']:.3f})"
            )
    for target in summary.get("targets", []):
        verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[target["holds"]]
        shown = "-" if target["ratio"] is None else f"{target['ratio']:.2f}x"
        print(
            f"{target['workers']} workers: {target['system']} / {baseline_name}: {shown} "
            f"(at least {target['at_least']:g}x: {verdict})"
        )
