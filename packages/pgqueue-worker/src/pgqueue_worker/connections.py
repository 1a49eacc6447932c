"""The worker's connections, each role with its own ``application_name``.

The claim loop and the reaper share the worker's pool (``pgqueue-worker``). The
heartbeat has a pool of its own (``pgqueue-worker-heartbeat``), so however busy the
main pool is, leases are always extended on time. LISTEN holds a dedicated session
(``pgqueue-worker-listen``). When the pool keeps a call waiting past its timeout, which
names no cause, a connection of a moment (``pgqueue-worker-probe``) asks the database
whether it is there. The names show up in ``pg_stat_activity``, which is how an
operator (or a test) tells a worker's connections apart. Each is built by
:mod:`pgqueue.connections`, as every connection pgqueue opens is.
"""

from __future__ import annotations

import psycopg
import psycopg_pool

from pgqueue import Queue, connections

MAIN = "pgqueue-worker"
HEARTBEAT = "pgqueue-worker-heartbeat"
LISTEN = "pgqueue-worker-listen"
PROBE = "pgqueue-worker-probe"


def open_pool(
    conninfo: str,
    *,
    application_name: str = MAIN,
    min_size: int = 1,
    max_size: int = 2,
    prepare: bool = True,
    check: bool = False,
) -> psycopg_pool.ConnectionPool:
    """The worker's pool to ``conninfo`` (see :func:`pgqueue.connections.open_pool`)."""
    return connections.open_pool(
        conninfo,
        name=application_name,
        application_name=application_name,
        min_size=min_size,
        max_size=max_size,
        prepare=prepare,
        check=check,
    )


def sibling_queue(queue: Queue, application_name: str) -> Queue:
    """A Queue on the same database and schema as ``queue``, with a one-connection pool
    of its own and no lifecycle hooks (for the heartbeat, which changes no job state).

    Its connection is in autocommit mode: each statement commits on the server as it
    runs, so a worker paused between a statement and its COMMIT (a frozen VM, SIGSTOP)
    cannot sit on the row locks of all its leases and keep the reaper from them.
    """
    return Queue(connections.sibling_pool(queue.pool, name=application_name), schema=queue.schema)


def dedicated_connection(queue: Queue, application_name: str) -> psycopg.Connection:
    """A new autocommit connection to the queue's database, outside any pool."""
    return connections.connect_beside(queue.pool, application_name=application_name)
