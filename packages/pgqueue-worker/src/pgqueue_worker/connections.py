"""The worker's connections, each role with its own ``application_name``.

The claim loop and the reaper share the worker's pool (``pgqueue-worker``). The
heartbeat has a pool of its own (``pgqueue-worker-heartbeat``), so however busy the
main pool is, leases are always extended on time. LISTEN holds a dedicated session
(``pgqueue-worker-listen``). The names show up in ``pg_stat_activity``, which is how an
operator (or a test) tells a worker's connections apart.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool

from pgqueue import Queue
from pgqueue.queue import DEFAULT_POOL_TIMEOUT, connection_defaults

MAIN = "pgqueue-worker"
HEARTBEAT = "pgqueue-worker-heartbeat"
LISTEN = "pgqueue-worker-listen"


def open_pool(
    conninfo: str,
    *,
    application_name: str = MAIN,
    min_size: int = 1,
    max_size: int = 2,
    prepare: bool = True,
    check: bool = False,
) -> psycopg_pool.ConnectionPool:
    """A pool to ``conninfo`` with pgqueue's connection defaults.

    It opens in the background: a worker started before its database is up waits for
    it instead of failing. ``check=True`` tests each connection as it is handed out,
    for a pool used rarely enough that a connection may have died while idle.
    """
    kwargs: dict[str, Any] = {**connection_defaults(conninfo), "application_name": application_name}
    if not prepare:
        kwargs["prepare_threshold"] = None
    return psycopg_pool.ConnectionPool(
        conninfo,
        kwargs=kwargs,
        min_size=min_size,
        max_size=max_size,
        timeout=DEFAULT_POOL_TIMEOUT,
        check=psycopg_pool.ConnectionPool.check_connection if check else None,
        open=True,
        name=application_name,
    )


def sibling_queue(queue: Queue, application_name: str) -> Queue:
    """A Queue on the same database and schema as ``queue``, with a one-connection pool
    of its own and no lifecycle hooks (for the heartbeat, which changes no job state).

    Its connection is in autocommit mode: each statement commits on the server as it
    runs, so a worker paused between a statement and its COMMIT (a frozen VM, SIGSTOP)
    cannot sit on the row locks of all its leases and keep the reaper from them.
    """
    conninfo, kwargs = queue.connection_settings()
    pool = psycopg_pool.ConnectionPool(
        conninfo,
        kwargs={
            **connection_defaults(conninfo),
            **kwargs,
            "application_name": application_name,
            "autocommit": True,
        },
        min_size=1,
        max_size=1,
        timeout=DEFAULT_POOL_TIMEOUT,
        check=psycopg_pool.ConnectionPool.check_connection,
        open=True,
        name=application_name,
    )
    return Queue(pool, schema=queue.schema)


def dedicated_connection(queue: Queue, application_name: str) -> psycopg.Connection:
    """A new autocommit connection to the queue's database, outside any pool."""
    conninfo, kwargs = queue.connection_settings()
    options = {**connection_defaults(conninfo), **kwargs, "application_name": application_name}
    return psycopg.connect(conninfo, autocommit=True, **options)
