"""next_tick, the pure function the scheduler reads the database's clock into: a frozen
clock (the ``after`` argument), Europe/Berlin across both 2026 transitions, 6-field
expressions, and the tick keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgqueue.schedules import ScheduleError, next_tick, tick_key, ticks

BERLIN = ZoneInfo("Europe/Berlin")


def berlin(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=BERLIN, fold=fold)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def upcoming(cron: str, after: datetime, count: int, timezone: str = "Europe/Berlin"):
    found = []
    for moment in ticks(cron, timezone, after):
        found.append(moment)
        if len(found) == count:
            return found
    raise AssertionError("unreachable")


# -- 29 March 2026: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:xx does not exist ------


def test_a_daily_tick_in_the_spring_gap_fires_once_at_the_end_of_the_gap() -> None:
    after = berlin(2026, 3, 27, 12, 0)
    assert upcoming("30 2 * * *", after, 3) == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # no 02:30 that night: 03:00 CEST, the end of the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_several_ticks_in_the_spring_gap_fire_as_one() -> None:
    after = berlin(2026, 3, 29, 1, 40)
    # 02:00, 02:15, 02:30, 02:45 do not exist: one tick at 03:00 CEST, then on.
    assert upcoming("*/15 * * * *", after, 3) == [
        utc(2026, 3, 29, 0, 45),  # 01:45 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST
        utc(2026, 3, 29, 1, 15),  # 03:15 CEST
    ]


def test_every_second_runs_straight_through_the_spring_gap() -> None:
    after = berlin(2026, 3, 29, 1, 59, 58)
    assert upcoming("* * * * * *", after, 3) == [
        utc(2026, 3, 29, 0, 59, 59),
        utc(2026, 3, 29, 1, 0, 0),  # 03:00:00 CEST: the next second in real time
        utc(2026, 3, 29, 1, 0, 1),
    ]


def test_an_hourly_schedule_keeps_its_real_pace_over_the_spring_gap() -> None:
    after = berlin(2026, 3, 29, 0, 30)
    assert upcoming("0 * * * *", after, 3) == [
        utc(2026, 3, 29, 0, 0),  # 01:00 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST: an hour later
        utc(2026, 3, 29, 2, 0),
    ]


# -- 25 October 2026: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:xx happens twice -----


def test_a_daily_tick_in_the_autumn_overlap_fires_once_at_its_first_occurrence() -> None:
    after = berlin(2026, 10, 23, 12, 0)
    assert upcoming("30 2 * * *", after, 3) == [
        utc(2026, 10, 24, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, first pass; not again at 02:30 CET
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
    ]


def test_a_schedule_that_names_its_hours_skips_the_whole_second_pass() -> None:
    after = berlin(2026, 10, 25, 1, 50)
    assert upcoming("*/30 2 * * *", after, 3) == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST
        utc(2026, 10, 26, 1, 0),  # 02:00 CET the next day: the second pass is skipped
    ]


def test_a_schedule_of_every_hour_fires_in_both_passes_of_the_overlap() -> None:
    after = berlin(2026, 10, 25, 1, 50)
    assert upcoming("*/30 * * * *", after, 5) == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET
        utc(2026, 10, 25, 1, 30),  # 02:30 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
    ]


def test_every_second_runs_straight_through_the_autumn_overlap() -> None:
    after = berlin(2026, 10, 25, 2, 59, 58)  # CEST, the first pass
    assert upcoming("* * * * * *", after, 3) == [
        utc(2026, 10, 25, 0, 59, 59),
        utc(2026, 10, 25, 1, 0, 0),  # 02:00:00 CET: the next second in real time
        utc(2026, 10, 25, 1, 0, 1),
    ]


def test_a_tick_from_within_the_second_pass_is_not_taken_for_the_first() -> None:
    # The clock reads 02:10 CET (the second pass): 02:30 has run in the first pass.
    after = berlin(2026, 10, 25, 2, 10, fold=1)
    assert after.utcoffset() == timedelta(hours=1)
    assert next_tick("30 2 * * *", "Europe/Berlin", after) == utc(2026, 10, 26, 1, 30)


# -- the rest --------------------------------------------------------------------------


def test_six_fields_lead_with_seconds() -> None:
    after = utc(2026, 1, 1, 0, 0, 0)
    assert upcoming("*/20 * * * * *", after, 3, "UTC") == [
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 40),
        utc(2026, 1, 1, 0, 1, 0),
    ]
    assert next_tick("30 5 * * * *", "UTC", after) == utc(2026, 1, 1, 0, 5, 30)


def test_the_next_tick_is_strictly_after_the_clock() -> None:
    assert next_tick("0 * * * *", "UTC", utc(2026, 1, 1, 5, 0)) == utc(2026, 1, 1, 6, 0)
    assert next_tick("* * * * * *", "UTC", utc(2026, 1, 1, 5, 0, 0)) == utc(2026, 1, 1, 5, 0, 1)


def test_a_naive_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_tick("* * * * *", "UTC", datetime(2026, 1, 1))


def test_an_expression_that_never_fires_is_an_error() -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        next_tick("0 0 30 2 *", "UTC", utc(2026, 1, 1))


def test_tick_keys_name_the_schedule_and_the_tick_in_utc() -> None:
    tick = berlin(2026, 10, 25, 2, 30)
    assert tick_key("nightly", tick) == "schedule:nightly@2026-10-25T00:30:00.000000Z"
    assert tick_key("nightly", tick) == tick_key("nightly", tick.astimezone(UTC))
    assert tick_key("nightly", tick) != tick_key("nightly", berlin(2026, 10, 25, 2, 30, fold=1))
