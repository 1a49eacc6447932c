"""What a worker says an outage is: psycopg_pool's timeout names no cause, so the
worker asks its probe (a connection of its own) why the database cannot be reached, and
asks again when the first answer was none."""

from __future__ import annotations

import psycopg_pool

from pgqueue import DatabaseUnavailable
from pgqueue_worker.outage import DatabaseHealth

REFUSED = 'database unavailable: connection to server at "127.0.0.1", port 9 failed: refused'


def _pool_timeout(wrapped: int = 1) -> DatabaseUnavailable:
    """A DatabaseUnavailable raised from psycopg_pool's timeout, through ``wrapped``
    DatabaseUnavailable layers."""
    error: BaseException = psycopg_pool.PoolTimeout("couldn't get a connection after 5.00 sec")
    for _ in range(wrapped):
        try:
            raise DatabaseUnavailable(f"database unavailable: {error}") from error
        except DatabaseUnavailable as exc:
            error = exc
    assert isinstance(error, DatabaseUnavailable)
    return error


def test_a_pool_timeout_is_explained_by_the_probe() -> None:
    health = DatabaseHealth(probe=lambda: REFUSED)

    health.failed("claim loop", _pool_timeout())

    assert health.explain() == REFUSED


def test_a_pool_timeout_wrapped_twice_is_still_explained_by_the_probe() -> None:
    health = DatabaseHealth(probe=lambda: REFUSED)

    health.failed("claim loop", _pool_timeout(wrapped=2))

    assert health.explain() == REFUSED


def test_the_probe_is_asked_again_when_it_had_no_answer_at_the_first_failure() -> None:
    answers = iter([None, REFUSED])
    health = DatabaseHealth(probe=lambda: next(answers))

    health.failed("claim loop", _pool_timeout())
    assert health.cause is not None and "couldn't get a connection" in health.cause

    assert health.explain() == REFUSED
    assert health.cause == REFUSED


def test_a_cause_with_its_reason_is_not_probed_again() -> None:
    calls: list[int] = []
    health = DatabaseHealth(probe=lambda: calls.append(1) or None)
    reason = DatabaseUnavailable("database unavailable: the database system is starting up")

    health.failed("heartbeat", reason)
    # A pool timeout later in the same outage does not replace the reason.
    health.failed("claim loop", _pool_timeout())

    assert health.explain() == "database unavailable: the database system is starting up"
    assert calls == []
