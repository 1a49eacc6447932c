"""The pure parts of the queue-controls measurements: the most jobs running at once,
the controls driver's summary, and the side-by-side runs' ratios to a baseline build
(paired within each repeat)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pgqueue_bench.peers import summary as peers_summary
from pgqueue_bench.scenarios.controls.summary import most_at_once, summarize

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_most_at_once_counts_overlaps_and_an_end_meeting_a_start_does_not_overlap():
    assert most_at_once([]) == 0
    assert most_at_once([(at(0), at(1)), (at(0.5), at(2)), (at(0.9), at(1.5))]) == 3
    assert most_at_once([(at(0), at(1)), (at(1), at(2)), (at(2), at(3))]) == 1
    # A job still running is open from its start on.
    assert most_at_once([(at(0), None), (at(5), at(6))]) == 2


def _cycle(quiet: float, first: float, late: int) -> dict:
    return {
        "scenario": "pause_resume",
        "pause_to_quiet_ms": quiet,
        "resume_to_first_start_ms": first,
        "starts_after_pause": late,
        "pause_command_ms": 1.0,
        "resume_command_ms": 2.0,
    }


def test_the_summary_spreads_the_cycles_and_judges_the_limits_by_their_worst_reading():
    runs = [
        _cycle(90.0, 10.0, 30),
        _cycle(0.0, 30.0, 0),
        _cycle(60.0, 20.0, 12),
        {
            "scenario": "concurrency_limit",
            "limit": 3,
            "most_running_sampled": 3,
            "most_running_from_jobs": 4,
            "jobs_per_second": 20.0,
        },
        {
            "scenario": "rate_limit",
            "rate_limit": 20.0,
            "window_seconds": 10.0,
            "starts": 204,
            "expected_starts": 200.0,
            "ratio_to_limit": 1.02,
        },
    ]
    summary = summarize(runs)
    assert summary["pause_to_quiet_ms"] == {"median": 60.0, "min": 0.0, "max": 90.0, "runs": 3}
    assert summary["resume_to_first_start_ms"]["median"] == 20.0
    assert summary["starts_after_pause"]["max"] == 30.0
    assert summary["concurrency_limit"] == {
        "limit": 3,
        "most_running": 4,
        "held": False,
        "jobs_per_second": 20.0,
    }
    assert summary["rate_limit"]["starts"] == 204
    assert summary["rate_limit"]["ratio_to_limit"] == pytest.approx(1.02)


def _run(
    system: str, workers: int, repeat: int, rate: float | None, verified=True, cpu=None
) -> dict:
    return {
        "scenario": "throughput",
        "system": system,
        "workers": workers,
        "repeat": repeat,
        "jobs_per_second": rate,
        "verified": verified,
        "cpu_us_per_job": cpu,
    }


def test_ratios_to_the_baseline_pair_runs_of_the_same_repeat():
    base = "pgqueue old"
    runs = [
        _run(base, 1, 1, 100.0),
        _run("pgqueue", 1, 1, 110.0),
        _run("pgqueue rate-limited", 1, 1, 90.0),
        # A slow repeat for every system: paired, its ratio is like the others.
        _run(base, 1, 2, 50.0),
        _run("pgqueue", 1, 2, 60.0),
        _run("pgqueue rate-limited", 1, 2, 45.0),
        _run(base, 1, 3, 100.0),
        _run("pgqueue", 1, 3, 105.0),
        _run("pgqueue rate-limited", 1, 3, 500.0, verified=False),  # does not count
        _run(base, 2, 1, 200.0),
        _run("pgqueue", 2, 1, 100.0),
        _run("pgqueue", 2, 2, 400.0),  # no baseline run in that repeat: no pair
        _run("pgqueuer", 1, 1, 1000.0),  # a peer, not asked for
    ]
    ratios = peers_summary.ratios_to_baseline(runs, base, ["pgqueue", "pgqueue rate-limited"])
    assert ratios["1"]["pgqueue"]["median"] == pytest.approx(1.1)
    assert ratios["1"]["pgqueue"]["min"] == pytest.approx(1.05)
    assert ratios["1"]["pgqueue"]["max"] == pytest.approx(1.2)
    assert ratios["1"]["pgqueue"]["runs"] == 3
    assert ratios["1"]["pgqueue rate-limited"]["median"] == pytest.approx(0.9)
    assert ratios["1"]["pgqueue rate-limited"]["runs"] == 2
    assert ratios["2"] == {"pgqueue": {"median": 0.5, "min": 0.5, "max": 0.5, "runs": 1}}


def test_the_summary_compares_pgqueue_with_peers_only_and_every_pgqueue_with_the_baseline():
    names = ["pgqueue", "pgqueuer", "pgqueue concurrency-limited", "pgqueue old"]
    runs = [
        _run("pgqueue", 1, 1, 100.0),
        _run("pgqueuer", 1, 1, 50.0),
        _run("pgqueue concurrency-limited", 1, 1, 99.0),
        _run("pgqueue old", 1, 1, 200.0),
    ]
    summary = peers_summary.summarize(runs, names, "pgqueue old")
    assert summary["pgqueue_vs_fastest_peer"]["1"]["fastest_peer"] == "pgqueuer"
    assert summary["vs_baseline"]["baseline"] == "pgqueue old"
    assert set(summary["vs_baseline"]["ratios"]["1"]) == {
        "pgqueue",
        "pgqueue concurrency-limited",
    }
    assert "vs_baseline" not in peers_summary.summarize(runs, names)


def test_cpu_per_job_is_summarised_and_paired_with_the_baseline_where_measured():
    names = ["pgqueue", "pgqueue old"]
    runs = [
        _run("pgqueue old", 1, 1, 100.0, cpu=50.0),
        _run("pgqueue", 1, 1, 110.0, cpu=45.0),
        _run("pgqueue old", 1, 2, 100.0, cpu=40.0),
        _run("pgqueue", 1, 2, 90.0, cpu=44.0),
        # A server on another machine: no CPU figure, so no CPU pair in that repeat.
        _run("pgqueue old", 1, 3, 100.0),
        _run("pgqueue", 1, 3, 100.0, cpu=10.0),
    ]
    summary = peers_summary.summarize(runs, names, "pgqueue old")
    assert summary["cpu_us_per_job"]["pgqueue"]["1"]["runs"] == 3
    assert summary["cpu_us_per_job"]["pgqueue old"]["1"]["median"] == pytest.approx(45.0)
    cpu = summary["vs_baseline"]["cpu_per_job_ratios"]["1"]["pgqueue"]
    assert (cpu["min"], cpu["max"], cpu["runs"]) == (pytest.approx(0.9), pytest.approx(1.1), 2)
    assert summary["vs_baseline"]["ratios"]["1"]["pgqueue"]["runs"] == 3
