import pytest

from pgqueue.backoff import backoff_ceiling, backoff_seconds


def test_backoff_doubles_per_attempt_until_the_cap():
    assert [backoff_ceiling(n, base=1, cap=100) for n in range(1, 9)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        100,
    ]


def test_backoff_is_half_fixed_half_random():
    assert backoff_seconds(4, base=1, cap=100, rand=lambda: 0.0) == 4
    assert backoff_seconds(4, base=1, cap=100, rand=lambda: 1.0) == 8
    assert backoff_seconds(4, base=1, cap=100, rand=lambda: 0.5) == 6


def test_backoff_with_huge_attempt_counts_stays_at_the_cap():
    assert backoff_seconds(10**9, base=1, cap=3600, rand=lambda: 1.0) == 3600


@pytest.mark.parametrize("attempt", [0, -5])
def test_backoff_treats_nonsense_attempts_as_the_first(attempt):
    assert backoff_ceiling(attempt, base=2, cap=100) == 2
