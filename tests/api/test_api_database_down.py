"""A database that is down, hung or read-only: 503 with Retry-After, never a traceback.

None of these stop a real server: the API is pointed at a closed port, at a socket that
accepts connections but never answers, or at a session that refuses writes.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from api_support import free_port
from polling import wait_for
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


def end_client_sessions(database_url: str) -> int:
    """What a server restart leaves behind: the server ends every other client session
    of the test's database, waiting until each has gone (a session only signalled could
    still pass a pool's check). Returns how many it ended."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        return admin.execute(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        ).fetchone()[0]


def test_after_its_connections_are_cut_the_api_answers_one_503_not_one_per_connection(
    start_api, database_url: str
):
    # What a server restart leaves behind: a pool full of connections that look fine
    # until used. Here the server ends the pool's four sessions itself, waiting until each
    # has gone: a session only signalled could still pass the pool's check.
    api = start_api(pool_size=4)
    pool = api.app.state.queue.pool
    pool.resize(min_size=4, max_size=4)
    pool.wait()
    assert api.client.get("/queues").status_code == 200
    ended = end_client_sessions(database_url)

    answers = [api.client.get("/queues").status_code for _ in range(6)]

    assert ended >= 4
    # The first request meets a dead connection; the pool is then checked, before the
    # same client's next request is read, and every dead connection replaced.
    assert answers == [503, 200, 200, 200, 200, 200]


def test_after_its_connections_are_cut_post_jobs_answers_one_503_not_one_per_connection(
    start_api, database_url: str
):
    # POST /jobs enqueues on the AsyncProducer's pool, which a restart kills as well:
    # it is checked after the first 503 too, whichever pool that request used.
    api = start_api(pool_size=8)
    pool = api.app.state.producer.pool

    def post_many(count: int) -> list[int]:
        with httpx.Client(base_url=api.url, timeout=60) as client:
            return [client.post("/jobs", json={"task": "echo"}).status_code for _ in range(count)]

    # Requests at once make the pool open all 4 of its connections.
    with ThreadPoolExecutor(8) as burst:
        statuses = [s for done in burst.map(post_many, [10] * 8) for s in done]
    assert set(statuses) == {201}
    wait_for(lambda: pool.get_stats()["pool_size"] == 4, 30, "the async pool to hold 4")
    ended = end_client_sessions(database_url)

    answers = post_many(6)

    assert ended >= 4
    assert answers == [503, 201, 201, 201, 201, 201]
