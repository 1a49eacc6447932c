"""Every connection pgqueue opens, built in one place.

A :class:`~pgqueue.Queue` runs its statements on a pool. The connections beside it (a
worker's heartbeat pool, its LISTEN session, a health check's connection, the API's
async pool) are made as the Queue's own are: the same conninfo, asked anew of a pool
that takes it from a function, and the same connection keyword arguments (prepared
statements or not), each under an ``application_name`` of its own so that
``pg_stat_activity`` tells them apart. A pool's ``configure`` callback is the pool's
own and is not carried over.

To all of them pgqueue adds :data:`CONNECTION_DEFAULTS`, less what the connection
string sets itself.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict

DEFAULT_POOL_TIMEOUT = 5.0
"""Seconds a statement waits for a free pooled connection before it fails."""

# Fail fast when the server is unreachable, and notice a dead peer within about half a
# minute: TCP keepalives for an idle connection (instead of the kernel's two hours),
# TCP_USER_TIMEOUT (milliseconds) for a statement in flight, which keepalives do not
# cover (instead of about fifteen minutes of retransmissions).
CONNECTION_DEFAULTS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
    "application_name": "pgqueue",
}


def connection_defaults(conninfo: str) -> dict[str, Any]:
    """CONNECTION_DEFAULTS less what ``conninfo`` sets itself: libpq takes keyword
    arguments over the connection string, so passing every default would silently undo
    a ``?connect_timeout=30`` or ``keepalives_idle=60`` chosen for a given network."""
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        given = {}  # malformed: connecting will say so
    return {name: value for name, value in CONNECTION_DEFAULTS.items() if name not in given}


def open_pool(
    conninfo: str,
    *,
    name: str = "pgqueue",
    application_name: str | None = None,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = DEFAULT_POOL_TIMEOUT,
    prepare: bool = True,
    check: bool = False,
) -> psycopg_pool.ConnectionPool:
    """A pool to ``conninfo`` with pgqueue's connection defaults.

    It opens in the background: a program started before its database is up waits for
    it instead of failing. ``prepare=False`` turns off server-side prepared statements
    (for PgBouncer in transaction mode); ``check=True`` tests each connection as it is
    handed out, for a pool used rarely enough that a connection may have died idle.
    """
    kwargs = connection_defaults(conninfo)
    if application_name is not None:
        kwargs["application_name"] = application_name
    if not prepare:
        kwargs["prepare_threshold"] = None
    return psycopg_pool.ConnectionPool(
        conninfo,
        kwargs=kwargs,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        check=psycopg_pool.ConnectionPool.check_connection if check else None,
        open=True,
        name=name,
    )


def settings_of(pool: psycopg_pool.ConnectionPool) -> tuple[str, dict[str, Any]]:
    """The conninfo and connection keyword arguments of ``pool``'s connections. A pool
    may take its conninfo from a function (psycopg_pool's dynamic conninfo): it is
    asked now, as the pool asks it for each connection."""
    kwargs = pool.kwargs() if callable(pool.kwargs) else dict(pool.kwargs or {})
    conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
    return conninfo, kwargs


def sibling_pool(
    pool: psycopg_pool.ConnectionPool,
    *,
    name: str,
    max_size: int = 1,
    autocommit: bool = True,
    check: bool = True,
) -> psycopg_pool.ConnectionPool:
    """A pool of connections of its own to ``pool``'s database, made as ``pool``'s are,
    under ``application_name`` ``name``: for work that must never wait for a busy pool
    (a worker's heartbeat). In autocommit mode by default, so that a process paused
    between a statement and its COMMIT (a frozen VM, SIGSTOP) cannot sit on the row
    locks the statement took."""
    conninfo, kwargs = settings_of(pool)
    return psycopg_pool.ConnectionPool(
        conninfo,
        kwargs={
            **connection_defaults(conninfo),
            **kwargs,
            "application_name": name,
            "autocommit": autocommit,
        },
        min_size=1,
        max_size=max_size,
        timeout=pool.timeout,
        check=psycopg_pool.ConnectionPool.check_connection if check else None,
        open=True,
        name=name,
    )


def async_sibling_pool(
    pool: psycopg_pool.ConnectionPool,
    *,
    name: str,
    max_size: int,
    timeout: float,
    application_name: str | None = None,
) -> psycopg_pool.AsyncConnectionPool:
    """An asyncio pool, not yet opened, of autocommit connections made as ``pool``'s
    are (see :class:`pgqueue.AsyncProducer`), under ``application_name`` if given."""
    conninfo, kwargs = settings_of(pool)
    if application_name is not None:
        kwargs = {**kwargs, "application_name": application_name}
    return psycopg_pool.AsyncConnectionPool(
        conninfo,
        kwargs={**kwargs, "autocommit": True},
        min_size=1,
        max_size=max_size,
        timeout=timeout,
        open=False,
        name=name,
    )


def connect_beside(
    pool: psycopg_pool.ConnectionPool,
    *,
    application_name: str | None = None,
    connect_timeout: int | None = None,
) -> psycopg.Connection:
    """A new autocommit connection to ``pool``'s database, made as ``pool``'s are but
    outside it: for a session of its own (LISTEN), or a health check that neither a
    pool's wait for a free connection nor a stale pooled connection may get in the way
    of. The caller closes it."""
    conninfo, kwargs = settings_of(pool)
    options = {**connection_defaults(conninfo), **kwargs}
    if application_name is not None:
        options["application_name"] = application_name
    if connect_timeout is not None:
        options["connect_timeout"] = connect_timeout
    return psycopg.connect(conninfo, autocommit=True, **options)


def connect(conninfo: str, *, autocommit: bool = False) -> psycopg.Connection:
    """A connection of its own to ``conninfo``, with pgqueue's defaults and no
    server-side prepared statements: for a one-off task (migrating, a check before a
    program starts) that must work through PgBouncer too. The caller closes it."""
    return psycopg.connect(
        conninfo, autocommit=autocommit, prepare_threshold=None, **connection_defaults(conninfo)
    )
