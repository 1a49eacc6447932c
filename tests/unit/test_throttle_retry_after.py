"""``pgqueue.Throttle.from_response`` and ``pgqueue.retry_after_seconds`` with real
httpx and requests responses, made locally (no network): Retry-After in seconds and as
an HTTP date, missing or unreadable, in any letter case."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
import requests

import pgqueue


def _httpx(status: int, headers: dict[str, str]) -> httpx.Response:
    return httpx.Response(status, headers=headers)


def _requests(status: int, headers: dict[str, str]) -> requests.Response:
    response = requests.models.Response()
    response.status_code = status
    response.headers.update(headers)
    return response


RESPONSES = pytest.mark.parametrize("make", [_httpx, _requests], ids=["httpx", "requests"])


def _http_date(after: timedelta) -> str:
    return format_datetime(datetime.now(UTC) + after, usegmt=True)


@RESPONSES
def test_retry_after_in_seconds(make) -> None:
    response = make(429, {"Retry-After": "7"})
    assert pgqueue.retry_after_seconds(response) == 7.0
    throttle = pgqueue.Throttle.from_response(response)
    assert throttle.seconds == 7.0
    assert throttle.scope == "job"


@RESPONSES
def test_retry_after_as_an_http_date(make) -> None:
    response = make(503, {"Retry-After": _http_date(timedelta(seconds=30))})
    seconds = pgqueue.retry_after_seconds(response)
    # Whole seconds on the wire, and a moment passes before it is read.
    assert seconds is not None and 28 <= seconds <= 30.5, seconds
    throttle = pgqueue.Throttle.from_response(response, scope="partition")
    assert 28 <= throttle.seconds <= 30.5
    assert throttle.scope == "partition"


@RESPONSES
def test_an_http_date_in_the_past_means_no_wait(make) -> None:
    response = make(429, {"Retry-After": _http_date(timedelta(minutes=-5))})
    seconds = pgqueue.retry_after_seconds(response)
    assert seconds is not None and 0 <= seconds < 1, seconds
    assert 0 <= pgqueue.Throttle.from_response(response).seconds < 1


@RESPONSES
def test_the_header_name_is_read_in_any_case(make) -> None:
    assert pgqueue.retry_after_seconds(make(429, {"retry-after": "3"})) == 3.0
    assert pgqueue.retry_after_seconds(make(429, {"RETRY-AFTER": "4"})) == 4.0


@RESPONSES
@pytest.mark.parametrize("headers", [{}, {"Retry-After": "soon"}, {"Retry-After": ""}])
def test_without_a_readable_retry_after_the_default_applies(make, headers) -> None:
    response = make(429, headers)
    assert pgqueue.retry_after_seconds(response) is None
    assert pgqueue.Throttle.from_response(response).seconds == 1.0
    throttle = pgqueue.Throttle.from_response(response, scope="queue", default=12.5)
    assert (throttle.seconds, throttle.scope) == (12.5, "queue")
