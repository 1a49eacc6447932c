"""The README's soak section, from a small hand-built results document: the run's shape,
the faults by kind with their slowest recovery, and one row per verdict item."""

from __future__ import annotations

from typing import Any

from pgqueue_bench.report import pages as report


def _document(passed: bool) -> dict[str, Any]:
    items = [
        {"name": "lost", "value": 0, "bound": "= 0", "passed": True},
        {"name": "rss_slope", "value": 31.5, "bound": "< 20 MiB/hour", "passed": passed},
        {"name": "history_size", "value": None, "bound": "<= 0.25 x", "passed": None},
    ]
    return {
        "environment": {"machine": {"cpu_count": 2}, "postgresql": {"version": "PostgreSQL 18.4"}},
        "parameters": {
            "minutes": 60,
            "workers": 3,
            "concurrency": 8,
            "lease_seconds": 10,
            "fault_every": [60, 180],
            "workload": {
                "in_process_per_second": 8,
                "api_per_second": 4,
                "limited_per_second": 1,
                "limited_concurrency": 2,
                "retention_seconds": 600,
            },
        },
        "samples": [{"elapsed_seconds": 10}],
        "faults": [{"kind": "server_crash"}, {"kind": "server_crash"}, {"kind": "read_only"}],
        "audit": {
            "acknowledged_enqueues": 50000,
            "outcomes": {"succeeded": 47000, "dead": 2500, "cancelled": 500},
            "schedule_ticks": 720,
            "handler_runs": 56000,
            "redeliveries": 6000,
            "failed_attempts": 7000,
            "pruned_by_retention": 40000,
        },
        "verdict": {
            "passed": passed,
            "items": items,
            "bounds": {"note": "an hour's bounds"},
            "recoveries": [
                {"kind": "server_crash", "recovered": True, "recovery_seconds": 4.2},
                {"kind": "server_crash", "recovered": True, "recovery_seconds": 9.7},
                {"kind": "read_only", "recovered": False, "recovery_seconds": None},
            ],
        },
    }


def test_the_soak_section_has_the_faults_and_a_row_per_verdict_item() -> None:
    lines = report.SECTIONS["soak"](_document(passed=True))
    text = "\n".join(lines)
    assert lines[0] == "### Soak: an hour of chaos"
    assert "read only 1; server crash 2 (slowest recovery 10 s)" in text
    assert "Verdict: **passed** (an hour's bounds)" in text
    assert "| acknowledged jobs lost | 0 | = 0 | holds |" in lines
    assert "| RSS slope, worst process (MiB/hour) | 31.50 | < 20 MiB/hour | holds |" in lines
    assert "| history slope once full (MiB/hour) | - | <= 0.25 x | not judged |" in lines
    assert "50,000 acknowledged enqueues (500 cancelled, 2,500 dead, 47,000 succeeded)" in text


def test_a_failed_soak_says_so_in_its_section() -> None:
    text = "\n".join(report.SECTIONS["soak"](_document(passed=False)))
    assert "Verdict: **failed**" in text
    assert "| < 20 MiB/hour | **fails** |" in text


def test_a_soak_document_counts_as_figures_for_the_report() -> None:
    assert report.has_figures(_document(passed=True))
