"""The fairness driver's summary and its section of the results page, from hand-built
runs: phases paired within each repeat, runs that were not verified left out, and the
targets' verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgqueue_bench.report import pages as report
from pgqueue_bench.scenarios.fairness.summary import describe_target, summarize

ENVIRONMENT = {
    "machine": {"cpu_count": 2, "cpu_model": "AMD EPYC", "memory_gib": 23.5, "python": "3.11.7"},
    "postgresql": {"server": "DATABASE_URL", "version": "PostgreSQL 18.4", "settings": {}},
}


def _latency(p50: float, p99: float) -> dict[str, Any]:
    """A tenant's figures; its handlers started 5 ms after their claims."""

    def percentiles(p50: float, p99: float) -> dict[str, float]:
        return {"p50": p50, "p95": p99, "p99": p99, "mean": p50, "max": p99}

    return {
        "jobs": 10,
        "latency_ms": percentiles(p50, p99),
        "to_handler_start_ms": percentiles(p50 + 5, p99 + 5),
    }


def _run(
    repeat: int,
    phase: str,
    small_p99: tuple[float, float],
    rate: float | None,
    *,
    verified: bool = True,
) -> dict[str, Any]:
    """A run whose two small tenants had these p99s (and p50s a tenth of them)."""
    tenants = {f"small-{n + 1}": _latency(p99 / 10, p99) for n, p99 in enumerate(small_p99)}
    if phase != "alone":
        tenants["big"] = _latency(900.0, 1800.0)
    return {
        "repeat": repeat,
        "phase": phase,
        "jobs": 100,
        "seconds": None if rate is None else 100 / rate,
        "jobs_per_second": rate,
        "verified": verified,
        "not_first_attempt_successes": 0 if verified else 1,
        "load_average_1m": 2.5 + repeat,
        "tenants": tenants,
        "small_tenants": _latency(min(small_p99) / 10, max(small_p99)),
        **({} if phase == "alone" else {"backlog_seconds": 3.0}),
        **({} if phase == "alone" else {"small_jobs_enqueued_during_backlog": 0.95}),
    }


def _runs(fair_p99: tuple[float, float] = (15.0, 30.0), fair_rate: float = 950.0) -> list[Any]:
    return [
        _run(1, "alone", (10.0, 20.0), None),
        _run(1, "fifo", (2000.0, 2100.0), 1000.0),
        _run(1, "fair-share", fair_p99, fair_rate),
        _run(1, "partition-limit", (12.0, 24.0), 800.0),
        # A second repeat whose alone run doubled: its ratios halve.
        _run(2, "alone", (20.0, 40.0), None),
        _run(2, "fifo", (2000.0, 2100.0), 1000.0),
        _run(2, "fair-share", fair_p99, fair_rate),
        # Not verified: left out of the spreads and of every ratio.
        _run(2, "partition-limit", (1.0, 1.0), 5.0, verified=False),
    ]


def test_ratios_pair_the_phases_within_each_repeat() -> None:
    summary = summarize(_runs())

    fair = summary["p99_over_alone"]["fair-share"]
    assert fair["small-1"] == {"median": 1.125, "min": 0.75, "max": 1.5, "runs": 2}
    assert fair["small tenants"]["max"] == 1.5  # 30 / 20 in the first repeat
    assert summary["jobs_per_second_over_fifo"]["fair-share"]["median"] == pytest.approx(0.95)
    # The unverified run counts nowhere: one repeat of partition-limit is left.
    assert summary["p99_over_alone"]["partition-limit"]["small-2"]["runs"] == 1
    assert summary["jobs_per_second_over_fifo"]["partition-limit"]["median"] == 0.8
    assert summary["phases"]["partition-limit"]["runs_not_counted"] == 1
    assert summary["phases"]["fifo"]["tenants"]["big"]["p50"]["median"] == 900.0
    assert summary["runs_not_counted"] == 1
    # To the handlers' start (5 ms after each claim here): 35 / 25 and 35 / 45.
    start = summary["to_handler_start_p99_over_alone"]["fair-share"]
    assert (start["min"], start["max"]) == (pytest.approx(35 / 45), pytest.approx(35 / 25))
    small = summary["phases"]["fifo"]["small tenants"]
    assert small["to_handler_start"]["p99"]["median"] == 2105.0


def test_targets_hold_when_fair_share_keeps_p99_and_rate() -> None:
    latency, rate = summarize(_runs())["targets"]

    assert (latency["ratio"], latency["holds"]) == (1.125, True)
    assert rate["ratio"] == pytest.approx(0.95) and rate["holds"] is True
    assert "holds" in describe_target(latency)


def test_targets_fail_for_the_worst_small_tenant_and_a_slow_drain() -> None:
    # small-2's p99 is 5x and 2.5x its p99 alone: the worst tenant decides.
    latency, rate = summarize(_runs(fair_p99=(15.0, 100.0), fair_rate=850.0))["targets"]

    assert latency["ratio"] == pytest.approx(3.75) and latency["holds"] is False
    assert rate["ratio"] == pytest.approx(0.85) and rate["holds"] is False
    assert describe_target(rate).endswith("(at least 0.9x: does NOT hold)")


def test_without_the_alone_phase_the_latency_target_is_not_measured() -> None:
    runs = [run for run in _runs() if run["phase"] != "alone"]

    latency, rate = summarize(runs)["targets"]

    assert (latency["ratio"], latency["holds"]) == (None, None)
    assert rate["holds"] is True
    assert "not measured" in describe_target(latency)


def test_the_results_page_has_a_fairness_section(tmp_path: Path) -> None:
    runs = _runs(fair_p99=(15.0, 100.0))
    document = {
        "benchmark": "fairness",
        "created_at": "2026-12-06T08:00:00+00:00",
        "environment": ENVIRONMENT,
        "parameters": {
            "big_jobs": 20000,
            "small_tenants": 2,
            "small_jobs": 100,
            "small_rate": 20.0,
            "job_ms": 5.0,
            "workers": 2,
            "phases": {"fifo": "backlog and trickle, no partition keys"},
        },
        "runs": runs,
        "summary": summarize(runs),
    }
    (tmp_path / "fairness.json").write_text(json.dumps(document))

    section = report.render(tmp_path).split("### Fairness", 1)[1]

    assert "A large tenant enqueues 20,000 jobs in one transaction" in section
    # Phase, small tenants' p50 and p99, the large tenant's p50 and p99, jobs/s.
    assert (
        "| `fifo` | 200.0 (200.0-200.0) | 2,100.0 (2,100.0-2,100.0) | 2,105.0 (2,105.0-2,105.0) "
        "| 900 (900-900) | 1,800 (1,800-1,800) | 1,000 (1,000-1,000) |"
    ) in section
    # One repeat of partition-limit was not verified: a single ratio, no range.
    assert "| small-2 | 78.75x (52.50-105.00) | 3.75x (2.50-5.00) | 1.20x |" in section
    assert (
        "| small tenants, to handler start | 65.49x (46.78-84.20) | 3.27x (2.33-4.20) | 1.16x |"
    ) in section
    assert "| jobs/s over `fifo` | - | 0.95x (0.95-0.95) | 0.80x |" in section
    assert "took 3.0-3.0 s to drain; 95%-95% of the small tenants' jobs" in section
    assert "1-minute load average at the runs' ends: 3.5-4.5." in section
    assert "(the worst tenant's median per-repeat ratio) | 3.75x | at most 2x | **no** |" in section
    assert "| jobs/s with fair share / jobs/s FIFO (median per-repeat ratio) | 0.95x |" in section
    assert "Raw data: `results/fairness.json`." in section
