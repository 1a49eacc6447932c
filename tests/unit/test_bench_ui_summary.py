"""The dashboard driver's pure parts: the summary of its timings and where its
history of finished jobs lies."""

from __future__ import annotations

import pytest

from pgqueue_bench.scenarios.ui import UiScenario, history_window, summarize


def test_the_summary_gives_each_pages_percentiles_and_the_worst_p99():
    timings = {"/ui": [float(n) for n in range(1, 101)], "workers": [2.0, 4.0], "none": []}
    summary = summarize(timings, budget_ms=50.0)
    assert summary["pages"]["/ui"] == {
        "requests": 100,
        "p50_ms": 50.5,
        "p99_ms": 99.01,
        "max_ms": 100.0,
    }
    assert summary["pages"]["workers"]["p50_ms"] == 3.0
    assert "none" not in summary["pages"]
    assert (summary["worst_page"], summary["worst_p99_ms"]) == ("/ui", 99.01)
    assert summary["met"] is False
    assert summarize({"workers": [2.0, 4.0]}, budget_ms=50.0)["met"] is True


def test_an_empty_summary_meets_nothing():
    summary = summarize({})
    assert summary["pages"] == {} and summary["worst_page"] is None
    assert summary["met"] is False


@pytest.mark.parametrize(("finished", "rate"), [(5_000_000, 100.0), (2000, 10.0)])
def test_the_history_ends_now_at_the_rate_asked(finished: int, rate: float):
    window = history_window(1_800_000_000.0, UiScenario(finished, rate, 10, 1, 5))
    assert window.end == 1_800_000_000.0
    assert window.step == pytest.approx(1 / rate)
    assert window.total == finished
    assert len(window.days()) >= 1
