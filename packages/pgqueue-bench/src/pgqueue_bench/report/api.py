"""The results page's section of the HTTP API benchmark (``pgqueue bench api``):
pgqueue-api beside the minimal FastAPI app, rates, latency and CPU per request, and the
ratios with their spread over the rounds."""

from __future__ import annotations

from typing import Any

from pgqueue_bench.report.tables import median_range, table

APPS = {"pgqueue-api": "`pgqueue-api`", "minimal": "minimal FastAPI app"}


def api_section(document: dict[str, Any]) -> list[str]:
    """Per app, POST /jobs and POST /jobs/batch side by side, then the ratios."""
    params = document["parameters"]
    rounds = document["runs"]

    def figure(app: str, phase: str, name: str, digits: int = 0) -> str:
        values = [r["apps"][app][phase][name] for r in rounds if app in r["apps"]]
        return median_range([v for v in values if v is not None], digits)

    rows = [
        [
            label,
            figure(app, "single", "requests_per_second"),
            figure(app, "single", "latency_p99_ms", 1),
            figure(app, "single", "app_cpu_ms_per_request", 3),
            figure(app, "single", "postgres_cpu_ms_per_request", 3),
            figure(app, "batch", "jobs_per_second"),
            figure(app, "batch", "app_cpu_ms_per_request", 2),
            figure(app, "batch", "postgres_cpu_ms_per_request", 2),
        ]
        for app, label in APPS.items()
    ]
    ratio = document["summary"]["ratio"]
    single, batch = ratio["single_requests_per_second"], ratio["batch_jobs_per_second"]
    return [
        "### HTTP API: pgqueue-api beside a minimal FastAPI app (median and min-max over rounds)",
        "",
        f"`wrk`, {params['wrk_connections']} connections on {params['wrk_threads']} threads, "
        f"{params['seconds_per_phase']} s per phase after {params['warmup_seconds']} s of "
        f"warm-up, against each app under uvicorn with {params['api_workers']} workers; "
        f"{params['rounds']} rounds, each starting both apps on fresh schemas, in alternating "
        f"order. `pgqueue-api`: {params['pgqueue_api']}. Minimal app: {params['minimal']}. "
        f"Batches of {params['batch_size']} jobs. CPU per request is the app's processes' "
        "and the PostgreSQL server's (every backend and helper) CPU time over the phase, "
        "divided by its requests.",
        "",
        *table(
            [
                "app",
                "`POST /jobs` req/s",
                "p99 ms",
                "app CPU ms/req",
                "PostgreSQL CPU ms/req",
                "`POST /jobs/batch` jobs/s",
                "app CPU ms/batch",
                "PostgreSQL CPU ms/batch",
            ],
            rows,
        ),
        "",
        "`pgqueue-api` over the minimal app, per round: `POST /jobs` "
        f"{_ratio(single)}, `POST /jobs/batch` {_ratio(batch)}.",
        "",
        *_cpu_ratios(ratio),
        *_machine_load(rounds),
    ]


def _machine_load(rounds: list[dict[str, Any]]) -> list[str]:
    """How busy the machine was: other work slows both apps, never the same in each."""
    loads = [r["load_average_1m"] for r in rounds if r.get("load_average_1m") is not None]
    if not loads:
        return []
    return [
        f"Load average (1 min) after each round: {min(loads):g} to {max(loads):g}; other "
        "work on the machine moves each app's rate from one phase to the next, which the "
        "spread of the ratios shows.",
        "",
    ]


def _cpu_ratios(ratio: dict[str, Any]) -> list[str]:
    """The ratios of CPU per request, which other work on a shared machine disturbs far
    less than the rates; none in documents written before they were recorded."""
    single, batch = ratio.get("single_cpu_per_request"), ratio.get("batch_cpu_per_request")
    if single is None or batch is None:
        return []
    return [
        "CPU per request (the app's and PostgreSQL's together), `pgqueue-api` over the "
        f"minimal app: `POST /jobs` {_ratio(single)}, `POST /jobs/batch` {_ratio(batch)} "
        "(below 1: `pgqueue-api` spends less).",
        "",
    ]


def _ratio(spread: dict[str, Any]) -> str:
    if spread["median"] is None:
        return "-"
    return f"{spread['median']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f})"
