"""The claim policy of a worker's slots: how many jobs to claim, when, and how fast to
look again (pgqueue_worker.slots)."""

from __future__ import annotations

import pytest

from pgqueue_worker.slots import RECHECK_SECONDS, RUN_TIME_WEIGHT, TOP_UP_SECONDS, SlotKind

POLL = 1.0


def test_without_a_run_time_yet_it_claims_one_job_per_free_slot() -> None:
    kind = SlotKind("plain", ["t"], size=4)
    assert kind.claim_limit(prefetch=512) == 4
    kind.started(3)
    assert kind.claim_limit(prefetch=512) == 1


def test_short_handlers_are_claimed_ahead_up_to_prefetch_and_long_ones_are_not() -> None:
    short = SlotKind("plain", ["t"], size=4)
    short.returned(0.001)  # 4 slots start 400 jobs within the 0.1 s horizon
    assert short.claim_limit(prefetch=512) == 4 + 400 + 1  # the returned one freed a slot
    assert short.claim_limit(prefetch=100) == 4 + 100 + 1
    assert short.claim_limit(prefetch=0) == 4 + 1

    slow = SlotKind("plain", ["t"], size=4)
    slow.returned(2.0)
    assert slow.claim_limit(prefetch=512) == 4 + 1


def test_with_every_slot_busy_it_tops_up_only_once_half_the_claimed_ahead_jobs_started() -> None:
    kind = SlotKind("plain", ["t"], size=2)
    kind.started(1)
    kind.returned(0.01)  # 2 slots start 20 jobs within the horizon: 20 ahead
    kind.started(2 + 20)
    assert kind.claim_limit(prefetch=512) == 0
    for _ in range(9):
        kind.returned(0.01)
    assert kind.claim_limit(prefetch=512) == 0  # room for 9 of the 20
    kind.returned(0.01)
    assert kind.claim_limit(prefetch=512) == 10


def test_the_run_time_is_a_running_average_and_a_handler_that_never_ran_leaves_it() -> None:
    kind = SlotKind("async", ["t"], size=10)
    kind.started(3)
    kind.returned(1.0)
    kind.returned(2.0)
    assert kind.typical_run == pytest.approx(1.0 + RUN_TIME_WEIGHT * 1.0)
    kind.returned(None)
    assert kind.typical_run == pytest.approx(1.1)
    assert kind.busy == 0


def test_a_claim_is_due_when_asked_for_after_a_poll_interval_or_when_a_job_is_due() -> None:
    kind = SlotKind("plain", ["t"], size=1)
    assert kind.due(now=0.0, poll_interval=POLL)  # the first claim
    kind.claiming(now=10.0)
    assert not kind.due(now=10.5, poll_interval=POLL)
    assert kind.due(now=11.0, poll_interval=POLL)
    kind.claimed(0, 1, next_run_seconds=0.2, poll_interval=POLL, now=10.1)
    assert not kind.due(now=10.2, poll_interval=POLL)
    assert kind.due(now=10.3, poll_interval=POLL)


def test_a_full_claim_asks_for_another_at_once() -> None:
    kind = SlotKind("plain", ["t"], size=8)
    kind.claiming(now=5.0)
    kind.claimed(8, 8, next_run_seconds=None, poll_interval=POLL, now=5.01)
    assert kind.claim_due and kind.due(now=5.01, poll_interval=POLL)


def test_a_runnable_job_it_could_not_claim_is_looked_for_again_backing_off() -> None:
    kind = SlotKind("plain", ["t"], size=8)
    waits = []
    for _ in range(10):
        kind.claiming(now=0.0)
        kind.claimed(0, 8, next_run_seconds=0.0, poll_interval=POLL, now=0.0)
        waits.append(kind.next_run_at)
    assert waits[:3] == [RECHECK_SECONDS, 2 * RECHECK_SECONDS, 4 * RECHECK_SECONDS]
    assert waits[-1] == POLL  # never longer than a poll
    # A claim that brought jobs starts again from the shortest wait.
    kind.claimed(3, 8, next_run_seconds=0.0, poll_interval=POLL, now=0.0)
    assert kind.next_run_at == RECHECK_SECONDS


def test_with_no_job_queued_it_waits_for_the_next_poll() -> None:
    kind = SlotKind("plain", ["t"], size=8)
    kind.claiming(now=3.0)
    kind.claimed(0, 8, next_run_seconds=None, poll_interval=POLL, now=3.0)
    assert kind.next_run_at is None
    assert kind.wake_times(retry_at=0.0, poll_interval=POLL) == [4.0]
    # During an outage's backoff, not before it ends.
    assert kind.wake_times(retry_at=9.0, poll_interval=POLL) == [9.0]


def test_a_kind_beside_a_keyed_backlog_tops_up_every_few_milliseconds_whatever_room_there_is() -> (
    None
):
    kind = SlotKind("plain", ["t"], size=2)
    kind.started(1)
    kind.returned(0.01)  # 2 slots start 20 jobs within the horizon: 20 ahead
    kind.claiming(now=10.0)
    kind.claimed(22, 22, None, POLL, now=10.0, keyed_backlog=True)
    kind.started(22)
    for _ in range(3):
        kind.returned(0.01)
    # Room for 3 of the 20: no claim by the prefetch's rule...
    assert kind.claim_limit(prefetch=512) == 0
    # ...but the last claim was of a keyed backlog: a top-up once due.
    assert kind.top_up_limit(prefetch=512, now=10.0 + TOP_UP_SECONDS / 2) == 0
    assert kind.top_up_at(prefetch=512) == pytest.approx(10.0 + TOP_UP_SECONDS)
    assert kind.top_up_limit(prefetch=512, now=10.0 + TOP_UP_SECONDS) == 3


def test_a_kind_tops_up_only_after_a_full_claim_of_a_keyed_backlog() -> None:
    kind = SlotKind("plain", ["t"], size=2)
    kind.started(1)
    kind.returned(0.01)
    kind.claimed(5, 22, None, POLL, now=1.0, keyed_backlog=True)  # short: nobody waits
    assert not kind.keyed_backlog
    assert kind.top_up_limit(prefetch=512, now=5.0) == 0 and kind.top_up_at(512) is None
    kind.claimed(22, 22, None, POLL, now=2.0, keyed_backlog=True)
    assert kind.keyed_backlog
    kind.started(22)  # no room at all: no wake-up for a top-up either
    assert kind.top_up_at(prefetch=512) is None
    kind.claimed(22, 22, None, POLL, now=3.0)
    assert not kind.keyed_backlog


def test_jobs_that_drain_half_the_prefetch_within_a_top_up_interval_are_not_topped_up() -> None:
    kind = SlotKind("plain", ["t"], size=2)
    kind.started(1)
    kind.returned(0.0001)  # 2 slots start 512 jobs within the horizon: the prefetch
    kind.claiming(now=10.0)
    kind.claimed(514, 514, None, POLL, now=10.0, keyed_backlog=True)
    kind.started(514)
    for _ in range(3):
        kind.returned(0.0001)
    # 253 jobs to go before the next claim: 13 ms of 0.1 ms jobs on 2 slots. Topped up.
    assert kind.tops_up(prefetch=512)
    for _ in range(100):
        kind.returned(0.0001)
    # 153 to go, 7.7 ms: the next claim comes sooner than a top-up would.
    assert not kind.tops_up(prefetch=512)
    assert kind.top_up_limit(prefetch=512, now=20.0) == 0
    assert kind.top_up_at(prefetch=512) is None
