"""Every connection pgqueue opens comes from pgqueue.connections: with its defaults (less
what the connection string sets), under the right application_name, and made as the
connections of the pool it stands beside."""

from __future__ import annotations

import asyncio

import psycopg
import psycopg_pool
from psycopg.conninfo import make_conninfo

from pgqueue import AsyncProducer, Queue, connections
from pgqueue_worker import connections as worker_connections


def parameters(conn: psycopg.Connection | psycopg.AsyncConnection) -> dict[str, str]:
    """The libpq connection parameters that differ from libpq's own defaults."""
    return conn.info.get_parameters()


def test_the_defaults_give_way_to_what_the_connection_string_sets(database_url: str) -> None:
    url = make_conninfo(database_url, keepalives_idle=60)
    defaults = connections.connection_defaults(url)
    assert "keepalives_idle" not in defaults
    assert defaults["tcp_user_timeout"] == connections.CONNECTION_DEFAULTS["tcp_user_timeout"]
    with connections.connect(url) as conn:
        assert parameters(conn)["keepalives_idle"] == "60"
        assert parameters(conn)["tcp_user_timeout"] == "30000"
        # One-off connections must work through PgBouncer: nothing is ever prepared.
        assert conn.prepare_threshold is None
    # A malformed string is left for connecting to reject, with libpq's own words.
    assert connections.connection_defaults("not a = valid = conninfo") == (
        connections.CONNECTION_DEFAULTS
    )


def test_a_queues_pool_and_the_connections_beside_it_carry_the_defaults(
    database_url: str,
) -> None:
    with Queue.connect(database_url, max_size=1, prepare=False) as queue:
        with queue.pool.connection() as conn:
            assert parameters(conn)["application_name"] == "pgqueue"
            assert parameters(conn)["keepalives_idle"] == "10"
            assert conn.prepare_threshold is None
        with connections.connect_beside(queue.pool, application_name="beside") as conn:
            assert conn.autocommit
            assert parameters(conn)["application_name"] == "beside"
            assert parameters(conn)["keepalives_idle"] == "10"
            # Made as the pool's connections are: no prepared statements either.
            assert conn.prepare_threshold is None
        sibling = connections.sibling_pool(queue.pool, name="sibling")
        try:
            with sibling.connection() as conn:
                assert conn.autocommit
                assert parameters(conn)["application_name"] == "sibling"
                assert conn.prepare_threshold is None
        finally:
            sibling.close()
        queue.ping()


def test_a_pool_that_asks_a_function_for_its_conninfo_is_asked_again(
    database_url: str,
) -> None:
    asked: list[str] = []

    def conninfo() -> str:
        asked.append("asked")
        return database_url

    pool = psycopg_pool.ConnectionPool(conninfo, min_size=1, max_size=1, open=True)
    try:
        pool.wait()  # the pool's own connection asked first
        before = len(asked)
        with connections.connect_beside(pool) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert len(asked) == before + 1
    finally:
        pool.close()


def test_the_workers_and_the_apis_connections_are_made_the_same_way(
    database_url: str, schema: str
) -> None:
    pool = worker_connections.open_pool(database_url, prepare=False)
    queue = Queue(pool, schema=schema)
    try:
        with pool.connection() as conn:
            assert parameters(conn)["application_name"] == worker_connections.MAIN
            assert conn.prepare_threshold is None
        heartbeat = worker_connections.sibling_queue(queue, worker_connections.HEARTBEAT)
        try:
            with heartbeat.pool.connection() as conn:
                assert parameters(conn)["application_name"] == worker_connections.HEARTBEAT
                assert parameters(conn)["keepalives_idle"] == "10"
                assert conn.autocommit
        finally:
            heartbeat.close()
        with worker_connections.dedicated_connection(queue, worker_connections.LISTEN) as conn:
            assert parameters(conn)["application_name"] == worker_connections.LISTEN
            assert conn.autocommit

        async def async_connection_parameters() -> tuple[dict[str, str], bool, int | None]:
            producer = await AsyncProducer.open(queue, max_size=1)
            try:
                async with producer.pool.connection() as conn:
                    return parameters(conn), conn.autocommit, conn.prepare_threshold
            finally:
                await producer.close()

        params, autocommit, prepare_threshold = asyncio.run(async_connection_parameters())
        assert params["application_name"] == worker_connections.MAIN
        assert autocommit
        assert prepare_threshold is None
    finally:
        queue.close()
