"""The enqueue driver's summary and its README section, from hand-built runs: medians
only of verified runs, the ratios and bounds with whether each holds, and what was not
measured said with its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgqueue_bench.report import pages as report
from pgqueue_bench.scenarios.enqueue import driver as enqueue
from pgqueue_bench.scenarios.enqueue import settings as enqueue_settings
from pgqueue_bench.scenarios.enqueue import summary as enqueue_summary


def _run(case: str, rate: float, *, verified: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "case": case,
        "jobs": int(rate),
        "seconds": 1.0,
        "jobs_per_second": rate,
        "verified": verified,
        "problems": [] if verified else ["counted 10 jobs, the table holds 0"],
        "load_average_1m": 1.5,
        **extra,
    }


RUNS = [
    _run("raw-insert-1", 3000.0, client_cpu_us_per_job=150.0, server_cpu_us_per_job=200.0),
    _run("raw-insert-1", 3400.0, client_cpu_us_per_job=170.0, server_cpu_us_per_job=180.0),
    _run("raw-insert-1", 3200.0, client_cpu_us_per_job=160.0, server_cpu_us_per_job=190.0),
    # Measured on a server of another machine: no server CPU.
    _run("enqueue-1", 2900.0, client_cpu_us_per_job=300.0),
    _run("enqueue-1", 3100.0, client_cpu_us_per_job=320.0),
    # Fast but its rows did not arrive: must not move any figure.
    _run("enqueue-1", 90000.0, verified=False),
    _run("pgqueuer-single", 2000.0),
    _run(
        "http-jobs",
        2500.0,
        requests_per_second=2500.0,
        latency_p50_ms=6.0,
        latency_p99_ms=61.5,
    ),
]
SKIPPED = {"procrastinate-single": "no --peer procrastinate=PYTHON given"}


def _document() -> dict[str, Any]:
    settings = enqueue_settings.Settings()
    chosen = ("raw-insert-1", "enqueue-1", "pgqueuer-single", "http-jobs", "procrastinate-single")
    return {
        "benchmark": "enqueue",
        "created_at": "2026-12-02T10:00:00+00:00",
        "environment": {
            "machine": {"cpu_count": 2, "cpu_model": "Xeon", "memory_gib": 23.5, "python": "3.11"},
            "postgresql": {"version": "PostgreSQL 15.20 on x86_64", "server": "DATABASE_URL"},
        },
        "parameters": {
            "seconds": 5.0,
            "warmup": 1.0,
            "repeats": 3,
            "cases": {c.name: c.label(settings) for c in enqueue.CASES if c.name in chosen},
        },
        "runs": RUNS,
        "summary": enqueue_summary.summarize(RUNS, SKIPPED),
    }


def _rows(lines: list[str]) -> dict[str, list[str]]:
    """Table rows by first cell, header and rule lines left out."""
    rows = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("case", "comparison (medians)", "---"):
            rows[cells[0]] = cells
    return rows


def test_the_summary_takes_medians_of_verified_runs_only() -> None:
    summary = enqueue_summary.summarize(RUNS, SKIPPED)

    assert summary["cases"]["enqueue-1"]["jobs_per_second"] == {
        "median": 3000.0,
        "min": 2900.0,
        "max": 3100.0,
        "runs": 2,
    }
    assert summary["cases"]["enqueue-1"]["runs_not_counted"] == 1
    ratios = {(r["numerator"], r["denominator"]): r for r in summary["ratios"]}
    assert ratios[("enqueue-1", "raw-insert-1")]["ratio"] == 3000.0 / 3200.0
    assert ratios[("enqueue-1", "raw-insert-1")]["holds"] is True  # 0.94 >= 0.9
    assert ratios[("enqueue-1", "pgqueuer-single")]["holds"] is True  # 1.5 >= 1.5
    unmeasured = ratios[("enqueue-16", "raw-insert-16")]
    assert (unmeasured["ratio"], unmeasured["holds"]) == (None, None)
    bounds = {(b["case"], b["figure"]): b for b in summary["bounds"]}
    assert bounds[("http-jobs", "requests_per_second")]["holds"] is True
    assert bounds[("http-jobs", "latency_p99_ms")]["holds"] is False  # 61.5 > 50
    assert bounds[("http-batch", "jobs_per_second")]["holds"] is None
    assert summary["skipped"] == SKIPPED


def test_the_section_shows_each_case_the_comparisons_and_what_was_skipped() -> None:
    lines = report.enqueue_section(_document())
    rows = _rows(lines)

    assert lines[0] == "### Enqueue: the producer path (median and min-max over runs)"
    assert rows["`raw-insert-1`"][1:] == [
        "raw INSERT, one row per transaction, 1 connection",
        "3,200 (3,000-3,400)",
        "-",
        "-",
        "-",
        "160.0 (150.0-170.0)",
        "190.0 (180.0-200.0)",
    ]
    assert rows["`enqueue-1`"][2] == "3,000 (2,900-3,100)"
    assert rows["`enqueue-1`"][6:] == ["310.0 (300.0-320.0)", "-"]
    assert rows["`http-jobs`"][2:] == ["2,500", "2,500", "6.0", "61.5", "-", "-"]
    assert "`procrastinate-single`" not in rows  # skipped: no row of figures
    assert rows["`enqueue-1` / `raw-insert-1`"][1:] == ["0.94x", "at least 0.9x", "yes"]
    assert rows["`enqueue-16` / `raw-insert-16`"][1:] == ["-", "at least 0.8x", "not measured"]
    assert rows["`http-jobs` latency p99 ms"][1:] == ["61.5", "at most 50", "**no**"]
    assert (
        "Not measured: procrastinate `defer_async`, one job per call: "
        "no --peer procrastinate=PYTHON given." in lines
    )


def test_the_readme_block_includes_the_section_when_there_are_results(tmp_path: Path) -> None:
    assert "Enqueue" not in report.render(tmp_path)
    (tmp_path / "enqueue.json").write_text(json.dumps(_document()))

    rendered = report.render(tmp_path)

    assert "### Enqueue: the producer path" in rendered
    assert "Raw data: `results/enqueue.json`." in rendered


def test_a_ratio_has_the_spread_of_each_repeats_pair_and_a_reference_no_verdict() -> None:
    runs = [
        {**_run("raw-insert-16", 4000.0), "repeat": 1},
        {**_run("enqueue-16", 3600.0), "repeat": 1},
        {**_run("raw-insert-16-pool", 3000.0), "repeat": 1},
        {**_run("raw-insert-16", 5000.0), "repeat": 2},
        {**_run("enqueue-16", 4000.0), "repeat": 2},
        {**_run("raw-insert-16-pool", 4500.0), "repeat": 2},
        # A repeat whose denominator did not count: no pair for that repeat.
        {**_run("raw-insert-16", 1.0, verified=False), "repeat": 3},
        {**_run("enqueue-16", 3800.0), "repeat": 3},
    ]
    summary = enqueue_summary.summarize(runs, {})
    ratios = {(r["numerator"], r["denominator"]): r for r in summary["ratios"]}

    held = ratios[("enqueue-16", "raw-insert-16")]
    assert held["ratio"] == 3800.0 / 4500.0
    assert held["per_repeat"] == {"median": pytest.approx(0.85), "min": 0.8, "max": 0.9, "runs": 2}
    assert held["holds"] is True
    reference = ratios[("raw-insert-16-pool", "raw-insert-16")]
    assert (reference["at_least"], reference["holds"]) == (None, None)
    assert enqueue_summary.describe_ratio(held) == (
        "enqueue-16 / raw-insert-16: 0.84x (per repeat 0.80-0.90x) (at least 0.8x: holds)"
    )
    assert enqueue_summary.describe_ratio(reference) == (
        "raw-insert-16-pool / raw-insert-16: 0.83x (per repeat 0.75-0.90x)"
    )

    document = {**_document(), "runs": runs, "summary": summary}
    rows = _rows(report.enqueue_section(document))
    assert rows["`enqueue-16` / `raw-insert-16`"][1:] == [
        "0.84x (0.80-0.90)",
        "at least 0.8x",
        "yes",
    ]
    assert rows["`raw-insert-16-pool` / `raw-insert-16`"][1:] == [
        "0.83x (0.75-0.90)",
        "reference",
        "-",
    ]
