"""The README's sections for the queue-controls driver and for a build measured
against an earlier one, from small hand-built documents."""

from __future__ import annotations

from typing import Any

from pgqueue_bench.report import pages as report


def _spread(median: float, low: float, high: float) -> dict[str, float]:
    return {"median": median, "min": low, "max": high, "runs": 3}


def test_the_baseline_table_shows_each_build_and_its_ratio_per_worker_count() -> None:
    document: dict[str, Any] = {
        "parameters": {"jobs": 5000, "systems": {"pgqueue": "the default worker"}},
        "summary": {
            "throughput": {
                "pgqueue": {"1": _spread(30000, 29000, 31000)},
                "pgqueue abc": {"1": _spread(32000, 31000, 33000)},
            },
            "vs_baseline": {
                "baseline": "pgqueue abc",
                "ratios": {"1": {"pgqueue": _spread(0.94, 0.9, 0.99)}},
            },
        },
    }
    lines = report.baseline_section(document)
    assert lines[0] == "### This build against pgqueue abc (jobs/s, median and min-max over runs)"
    assert "| workers | pgqueue abc | pgqueue |" in lines
    assert "| 1 | 32,000 (31,000-33,000) | 30,000 (29,000-31,000) (0.94x, 0.90-0.99) |" in lines
    assert "- pgqueue: the default worker" in lines


def test_the_controls_section_reports_latencies_and_whether_the_limits_held() -> None:
    document: dict[str, Any] = {
        "parameters": {
            "workers": 2,
            "concurrency": 4,
            "job_ms": 20,
            "cycles": 20,
            "concurrency_workers": 4,
        },
        "summary": {
            "pause_to_quiet_ms": _spread(83.0, 60.7, 94.9),
            "resume_to_first_start_ms": _spread(7.9, 6.0, 10.2),
            "starts_after_pause": _spread(30, 21, 35),
            "concurrency_limit": {"limit": 3, "most_running": 4, "held": False},
            "rate_limit": {
                "limit": 20.0,
                "window_seconds": 10.0,
                "starts": 202,
                "expected_starts": 200.0,
                "ratio_to_limit": 1.01,
            },
        },
    }
    lines = report.controls_section(document)
    assert "| resume to the first start (ms) | 7.9 | 6.0-10.2 |" in lines
    assert "- Concurrency limit 3 with 4 workers: at most 4 running at once (**exceeded**)." in (
        lines
    )
    assert any(line.startswith("- Rate limit 20/s: 202 starts in 10 s") for line in lines)
