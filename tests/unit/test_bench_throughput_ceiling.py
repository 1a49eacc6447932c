"""The default drain against the batched ceiling in the throughput summary and on the
results page: one ratio per round, from the two runs of that round."""

from __future__ import annotations

from typing import Any

from pgqueue_bench.report import pages as report
from pgqueue_bench.scenarios.throughput.driver import ratios_by_round, summarize_runs


def _run(repeat: int, mode: str, rate: float, *, verified: bool = True) -> dict[str, Any]:
    return {
        "repeat": repeat,
        "mode": mode,
        "workers": 4,
        "jobs": 20_000,
        "seconds": 20_000 / rate,
        "jobs_per_second": rate,
        "verified": verified,
    }


RUNS = [
    _run(1, "default", 40_000.0),
    _run(1, "batched-ceiling", 50_000.0),
    _run(2, "default", 30_000.0),
    _run(2, "batched-ceiling", 50_000.0),
    _run(3, "default", 45_000.0),
    _run(3, "batched-ceiling", 50_000.0),
]


def test_each_round_gives_one_ratio_of_its_own_two_runs() -> None:
    assert ratios_by_round(RUNS, "default", "batched-ceiling", 4) == [0.8, 0.6, 0.9]
    # Not the ratio of the medians (45,000 / 50,000 here): rounds are paired.
    spread = summarize_runs(RUNS)["default"]["4"]["ratio_to_batched-ceiling"]
    assert spread == {"median": 0.8, "min": 0.6, "max": 0.9, "runs": 3}
    assert "ratio_to_batched-ceiling" not in summarize_runs(RUNS)["batched-ceiling"]["4"]


def test_a_round_with_an_unverified_run_gives_no_ratio() -> None:
    runs = [*RUNS[:2], _run(2, "default", 30_000.0, verified=False), *RUNS[3:]]
    assert ratios_by_round(runs, "default", "batched-ceiling", 4) == [0.8, 0.9]


def test_no_ceiling_runs_no_ratio() -> None:
    without = [run for run in RUNS if run["mode"] == "default"]
    assert "ratio_to_batched-ceiling" not in summarize_runs(without)["default"]["4"]


def test_the_results_page_gives_the_ratio_with_its_spread_over_rounds() -> None:
    document = {
        "parameters": {"jobs": 20_000},
        "runs": RUNS,
        "summary": summarize_runs(RUNS),
        "environment": {"machine": {"cpu_count": 2}},
    }
    text = "\n".join(report.throughput_section(document))
    assert "| workers | default | batched-ceiling |" in text
    assert "by processes: 0.80x (0.60-0.90) at 4." in text


def test_the_results_page_names_a_run_far_slower_than_its_median() -> None:
    stalled = {**_run(2, "default", 600.0), "client_cpu_us_per_job": 90.0}
    stalled |= {"server_cpu_us_per_job": 1200.0, "not_first_attempt_successes": 0}
    runs = [RUNS[0], RUNS[1], stalled, RUNS[3], RUNS[4], RUNS[5]]
    document = {"parameters": {"jobs": 20_000}, "runs": runs, "summary": summarize_runs(runs)}
    text = "\n".join(report.throughput_section(document))
    assert (
        "Runs slower than 0.25 of their median (stalls, not spread): default, 4 processes, "
        "round 2: 600 jobs/s, 33.3 s, 90 / 1,200 µs of CPU per job, workers / server."
    ) in text
    calm = "\n".join(report.throughput_section({**document, "runs": RUNS}))
    assert "stalls" not in calm
