"""The soak's verdict math, on hand-built samples: least-squares slopes, flatness after
warm-up, recovery after a fault, the history's growth once full, and the judgement of
lost and doubly completed jobs from an audit trail."""

from __future__ import annotations

import pytest

from pgqueue_bench.scenarios.soak import verdict as soak_verdict
from pgqueue_bench.scenarios.soak.verdict import Bounds
from pgqueue_bench.verdict import audit

HOUR = Bounds.for_minutes(60)
SHORT = Bounds.for_minutes(3)


def sample(at: float, *, per_second: float | None = 10.0, window: float = 10.0, **extra):
    """A database sample at ``at`` seconds whose window had ``per_second`` finishes."""
    return {
        "elapsed_seconds": at,
        "missing": None,
        "window_seconds": window,
        "throughput_per_second": per_second,
        "connections": {"total": extra.pop("connections", 20)},
        "rss_mib": extra.pop("rss", {}),
        "tables": extra.pop("tables", {}),
        **extra,
    }


def missing(at: float):
    return {"elapsed_seconds": at, "missing": "OperationalError: server down", "rss_mib": {}}


def fault(start: float, end: float, kind: str = "server_crash"):
    return {"kind": kind, "start_elapsed_seconds": start, "end_elapsed_seconds": end}


def test_the_slope_of_a_line_is_its_rise_per_hour():
    points = [(t, 50 + t / 60) for t in range(0, 600, 10)]  # 1 MiB a minute
    assert soak_verdict.slope_per_hour(points) == pytest.approx(60.0)


def test_a_flat_noisy_series_has_a_slope_near_zero():
    points = [(t, 50 + (1 if t % 20 else -1)) for t in range(0, 3600, 10)]
    assert abs(soak_verdict.slope_per_hour(points)) < 0.1


def test_no_slope_without_two_points_in_time():
    assert soak_verdict.slope_per_hour([(5, 1.0)]) is None
    assert soak_verdict.slope_per_hour([(5, 1.0), (5, 2.0)]) is None


def test_a_leaking_process_breaks_the_rss_bound_and_a_flat_one_does_not():
    samples = [
        sample(t, rss={"worker 1": 45.0, "worker 2": 45 + t / 3600 * 30})
        for t in range(0, 3600, 10)
    ]
    (item, *_) = soak_verdict.resource_items(samples, HOUR)
    assert item["name"] == "rss_slope"
    assert item["passed"] is False
    assert item["value"] == pytest.approx(30, rel=0.01)
    assert abs(item["detail"]["worker 1"]) < 1e-6


def test_warm_up_growth_is_not_held_against_a_process():
    # 40 MiB in the first ten minutes (imports, caches), then flat.
    samples = [sample(t, rss={"worker 1": 45 + min(t, 600) / 15}) for t in range(0, 3600, 10)]
    (item, *_) = soak_verdict.resource_items(samples, HOUR)
    assert item["passed"] is True


def test_a_replacement_worker_gets_its_own_warm_up():
    early = [sample(t, rss={"worker 1": 45.0}) for t in range(0, 1800, 10)]
    # Started at 30 minutes, it grows for its first ten minutes, then stays flat.
    late = [
        sample(t, rss={"worker 2": 45 + min(t - 1800, 600) / 15}) for t in range(1800, 3600, 10)
    ]
    (item, *_) = soak_verdict.resource_items(early + late, HOUR)
    assert item["passed"] is True
    assert abs(item["detail"]["worker 2"]) < 1e-6


def test_a_connection_leaked_per_fault_breaks_the_connection_bound():
    # One more connection every two minutes: 30 an hour.
    samples = [sample(t, connections=20 + t // 120) for t in range(0, 3600, 10)]
    _, item, _ = soak_verdict.resource_items(samples, HOUR)
    assert item["name"] == "connections_slope"
    assert item["passed"] is False


def test_missing_samples_are_left_out_not_counted_as_zero():
    samples = [missing(t) if 1200 <= t < 1260 else sample(t) for t in range(0, 3600, 10)]
    _, connections, _ = soak_verdict.resource_items(samples, HOUR)
    assert connections["value"] == pytest.approx(0.0, abs=1e-6)


def test_an_active_jobs_table_over_its_bound_fails():
    table = {"active_jobs": {"table_mib": 40.0, "index_mib": 2.0}}
    samples = [sample(t, tables=table) for t in range(0, 3600, 10)]
    *_, item = soak_verdict.resource_items(samples, HOUR)
    assert item["name"] == "active_jobs_size"
    assert (item["passed"], item["value"]) == (False, 42.0)


def test_too_few_samples_after_warm_up_are_not_judged_rather_than_passed():
    samples = [sample(t, rss={"worker 1": 45.0}) for t in range(0, 300, 10)]
    rss, connections, active = soak_verdict.resource_items(samples, HOUR)
    assert rss["passed"] is None and connections["passed"] is None and active["passed"] is None


def history(retention: float, grows_after: bool):
    """finished_jobs filling at 1 MiB a minute until ``retention``, then flat or not."""
    samples = []
    for t in range(0, 3600, 10):
        mib = min(t, retention) / 60 + (t / 120 if grows_after and t > retention else 0)
        samples.append(sample(t, tables={"finished_jobs": {"table_mib": mib, "index_mib": 0.0}}))
    return samples


def test_a_pruned_history_that_stops_growing_passes():
    item = soak_verdict.history_item(history(600, grows_after=False), HOUR, 600, 60)
    assert item["passed"] is True
    assert item["detail"]["filling_mib_per_hour"] == pytest.approx(60, rel=0.05)


def test_a_history_that_keeps_growing_past_its_retention_fails():
    item = soak_verdict.history_item(history(600, grows_after=True), HOUR, 600, 60)
    assert item["passed"] is False


def steady(until: float, *, dip: tuple[float, float] | None = None, level: float = 10.0):
    """Samples every 10 s at ``level``, at zero during ``dip`` (start, end)."""
    found = []
    for t in range(10, int(until), 10):
        low = dip is not None and dip[0] < t <= dip[1]
        found.append(sample(t, per_second=0.0 if low else level))
    return found


def test_recovery_is_the_first_window_back_at_the_share_after_the_fault_ended():
    samples = steady(600, dip=(300, 330))
    (found,) = soak_verdict.recoveries(samples, [fault(295, 322)], HOUR)
    assert found["recovered"] is True
    assert found["pre_fault_per_second"] == 10.0
    assert found["recovery_seconds"] == pytest.approx(340 - 322)


def test_a_throughput_that_stays_low_past_the_bound_did_not_recover():
    samples = steady(600, dip=(300, 420))
    (found,) = soak_verdict.recoveries(samples, [fault(295, 322)], HOUR)
    assert (found["recovered"], found["why"]) == (False, "not within the bound")
    item = soak_verdict.recovery_item([found], HOUR)
    assert item["passed"] is False


def test_a_fault_the_next_one_interrupts_before_recovery_did_not_recover():
    samples = steady(900, dip=(300, 420))
    first, second = soak_verdict.recoveries(
        samples, [fault(295, 322), fault(350, 360, "read_only")], HOUR
    )
    assert (first["recovered"], first["why"]) == (False, "the next fault began first")
    # The second met a queue already at a standstill: no level to return to.
    assert (second["recovered"], second["why"]) == (None, "no throughput before")


def test_a_fault_with_no_window_before_it_is_not_judged():
    (found,) = soak_verdict.recoveries(steady(600), [fault(5, 10)], HOUR)
    assert found["recovered"] is None
    assert soak_verdict.recovery_item([found], HOUR)["passed"] is None


def test_a_fault_whose_bound_outlasts_the_run_is_not_judged():
    samples = steady(400, dip=(300, 400))
    (found,) = soak_verdict.recoveries(samples, [fault(295, 322)], HOUR, run_end=340)
    assert (found["recovered"], found["why"]) == (None, "the run ended")


def test_a_short_runs_bounds_are_looser_and_say_so():
    assert SHORT.rss_mib_per_hour > HOUR.rss_mib_per_hour
    assert SHORT.connections_per_hour > HOUR.connections_per_hour
    assert "short run" in SHORT.note


def test_the_verdict_fails_on_any_failed_item_and_lists_those_not_judged():
    items = [
        {"name": "lost", "value": 0, "bound": "= 0", "passed": True, "detail": None},
        {"name": "rss_slope", "value": 30, "bound": "< 20", "passed": False, "detail": None},
        {"name": "history_size", "value": None, "bound": "x", "passed": None, "detail": None},
    ]
    verdict = soak_verdict.verdict(items, HOUR)
    assert verdict["passed"] is False
    assert verdict["failed"] == ["rss_slope"]
    assert verdict["not_judged"] == ["history_size"]
    assert soak_verdict.verdict(items[:1], HOUR)["passed"] is True


def row(job_id: int, from_state: str, to_state: str, attempts: int = 1) -> dict:
    return {"job_id": job_id, "from_state": from_state, "to_state": to_state, "attempts": attempts}


def test_the_audit_judgement_finds_lost_doubly_acked_and_unknown_jobs():
    trail = [
        row(1, "queued", "running"),
        row(1, "running", "succeeded"),
        row(2, "queued", "running"),
        row(2, "running", "succeeded"),
        row(2, "succeeded", "pruned"),
        row(3, "queued", "running"),
        row(3, "running", "succeeded"),
        row(3, "queued", "running", 2),
        row(3, "running", "succeeded", 2),
        row(9, "queued", "running"),
        row(9, "running", "queued"),
    ]
    judged = audit.judge(
        {"a": 1, "b": 2, "c": 3, "d": 4},
        {1: "succeeded", 3: "succeeded", 9: "queued"},
        trail,
        [(1, 1), (3, 1), (3, 2)],
        wanted=audit.FINISHED,
    )
    assert judged.final_states[2] == "succeeded"  # pruned, judged by the state it left in
    assert judged.lost == ["d"]
    assert judged.double_acks == [3]
    assert judged.contradicted_acks == [(3, 1), (3, 2)]
    assert judged.unacknowledged == [9]
    assert judged.completed_twice == 3
    assert (judged.pruned, judged.failed_attempts, judged.acks_written) == (1, 1, 4)
