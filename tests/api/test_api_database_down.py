"""A database that is down, hung or read-only: 503 with Retry-After, never a traceback.

None of these stop a real server: the API is pointed at a closed port, at a socket that
accepts connections but never answers, or at a session that refuses writes.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from api_support import free_port
from psycopg.conninfo import make_conninfo


@pytest.fixture
def down(start_api) -> httpx.Client:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    return start_api(database_url=url, pool_timeout=0.2).client


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port whose listener completes TCP handshakes and then never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def _assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) > 0
    assert response.json()["detail"] == "database unavailable; retry later"


def test_healthz_is_503_within_three_seconds_when_the_database_is_down(down: httpx.Client):
    response = down.get("/healthz", timeout=3.0)
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert "retry-after" in response.headers


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/jobs", {"task": "echo"}),
        ("POST", "/jobs/batch", {"jobs": [{"task": "echo"}]}),
        ("GET", "/jobs", None),
        ("GET", "/jobs/1", None),
        ("POST", "/jobs/1/cancel", None),
        ("POST", "/jobs/1/retry", None),
        ("GET", "/queues", None),
        ("GET", "/metrics", None),
    ],
)
def test_every_route_is_503_with_retry_after_when_the_database_is_down(
    down: httpx.Client, method, path, body
):
    _assert_unavailable(down.request(method, path, json=body))


def test_healthz_gives_up_on_a_database_that_never_answers(start_api, silent_server):
    url = f"postgresql://postgres@127.0.0.1:{silent_server}/postgres"
    client = start_api(database_url=url, pool_timeout=1.0).client
    # The pool's own checks and TCP keepalives would take far longer than this bound.
    response = client.get("/healthz", timeout=10.0)
    assert response.status_code == 503


def test_writes_to_a_read_only_database_are_503_while_reads_work(start_api, database_url):
    read_only = make_conninfo(database_url, options="-c default_transaction_read_only=on")
    client = start_api(database_url=read_only).client
    _assert_unavailable(client.post("/jobs", json={"task": "echo"}))
    assert client.get("/jobs").status_code == 200
    assert client.get("/healthz").status_code == 200
