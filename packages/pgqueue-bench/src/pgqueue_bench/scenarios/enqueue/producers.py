"""The enqueue cases measured in this process: raw SQL into ``plain_jobs`` (a row per
INSERT on a held connection or on one taken from a psycopg_pool pool per call, arrays
per INSERT, COPY) and pgqueue's ``Queue.enqueue`` and
``Queue.enqueue_many``, each producer in a thread of its own, run by
:func:`run_producers` through a warm-up and then a measured window.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.types.json import Jsonb

from pgqueue import JobSpec, Queue
from pgqueue_bench.infra import database
from pgqueue_bench.infra.server_cpu import ServerCpu, server_cpu_of
from pgqueue_bench.scenarios.enqueue.outcome import Timing, count_rows, outcome
from pgqueue_bench.scenarios.enqueue.settings import (
    CASE_OVERHEAD_TIMEOUT,
    QUEUE_NAME,
    SCHEMA_PREFIX,
    STATEMENTS,
    TASK,
    Settings,
)
from pgqueue_bench.sql.queries import schema_statement_in

# -- producers in threads -------------------------------------------------------------


@dataclass
class _Tally:
    warmup_jobs: int = 0
    jobs: int = 0
    calls: int = 0
    finished_at: float = 0.0
    failure: BaseException | None = None


def run_producers(
    producers: Sequence[Callable[[], int]],
    seconds: float,
    warmup: float,
    server_cpu: ServerCpu | None = None,
) -> Timing:
    """Call each producer over and over, each in a thread of its own: during ``warmup``
    (at least once each), then, from the moment all have warmed up, for ``seconds``.
    A call returns how many jobs it added. The first producer failure is raised.

    The CPU time this process spends in the measured window is counted, and the
    server's, read by ``server_cpu``, when given."""
    tallies = [_Tally() for _ in producers]
    window: dict[str, float] = {}

    def open_window() -> None:  # run once, by the last producer to warm up
        if server_cpu is not None:
            window["server_cpu"] = server_cpu()
        window["client_cpu"] = time.process_time()
        window["start"] = time.perf_counter()
        window["stop"] = window["start"] + seconds

    warmed_up = threading.Barrier(len(producers), action=open_window)
    warm_until = time.perf_counter() + warmup

    def produce(produce_once: Callable[[], int], tally: _Tally) -> None:
        try:
            tally.warmup_jobs += produce_once()
            while time.perf_counter() < warm_until:
                tally.warmup_jobs += produce_once()
            warmed_up.wait()
            while time.perf_counter() < window["stop"]:
                tally.jobs += produce_once()
                tally.calls += 1
        except threading.BrokenBarrierError:
            pass  # another producer failed: its failure is the one to report
        except BaseException as exc:
            tally.failure = exc
            warmed_up.abort()
        finally:
            tally.finished_at = time.perf_counter()

    threads = [
        threading.Thread(target=produce, args=pair, name=f"producer-{n}", daemon=True)
        for n, pair in enumerate(zip(producers, tallies, strict=True))
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + warmup + seconds + CASE_OVERHEAD_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise TimeoutError(f"{thread.name} still busy long after its time was up")
    client_cpu = time.process_time() - window["client_cpu"]
    server_seconds = None if server_cpu is None else server_cpu() - window["server_cpu"]
    for tally in tallies:
        if tally.failure is not None:
            raise tally.failure
    return Timing(
        jobs=sum(t.jobs for t in tallies),
        calls=sum(t.calls for t in tallies),
        seconds=max(t.finished_at for t in tallies) - window["start"],
        warmup_jobs=sum(t.warmup_jobs for t in tallies),
        client_cpu_seconds=client_cpu,
        server_cpu_seconds=server_seconds,
    )


def _payloads(numbers: Iterator[int], count: int) -> list[dict[str, int]]:
    return [{"seq": next(numbers)} for _ in range(count)]


def _raw_insert(conn: psycopg.Connection, schema: str, batch: int) -> Callable[[], int]:
    """One prepared statement per call: one row, or ``batch`` rows from arrays."""
    if batch == 1:
        one = schema_statement_in(STATEMENTS, "plain_insert_one", schema)
        numbers = itertools.count()

        def insert_one() -> int:
            params = {"queue": QUEUE_NAME, "task": TASK, "payload": Jsonb({"seq": next(numbers)})}
            conn.execute(one, params, prepare=True).fetchone()
            return 1

        return insert_one
    many = schema_statement_in(STATEMENTS, "plain_insert_many", schema)
    numbers = itertools.count()

    def insert_many() -> int:
        params = {
            "queue": [QUEUE_NAME] * batch,
            "task": [TASK] * batch,
            "payload": [Jsonb(payload) for payload in _payloads(numbers, batch)],
        }
        conn.execute(many, params, prepare=True).fetchall()
        return batch

    return insert_many


def _raw_insert_pooled(pool: psycopg_pool.ConnectionPool, schema: str) -> Callable[[], int]:
    """One prepared single-row INSERT per call, on a connection taken from ``pool`` for
    the call and returned after it: what psycopg_pool's checkout and return add to the
    statement, with nothing of pgqueue's."""
    one = schema_statement_in(STATEMENTS, "plain_insert_one", schema)
    numbers = itertools.count()

    def insert_one() -> int:
        params = {"queue": QUEUE_NAME, "task": TASK, "payload": Jsonb({"seq": next(numbers)})}
        with pool.connection() as conn:
            conn.execute(one, params, prepare=True).fetchone()
        return 1

    return insert_one


def _raw_copy(conn: psycopg.Connection, schema: str, batch: int) -> Callable[[], int]:
    """One ``COPY`` of ``batch`` rows per call, each its own transaction."""
    copy_in = schema_statement_in(STATEMENTS, "plain_copy", schema)
    numbers = itertools.count()

    def copy_rows() -> int:
        with conn.cursor() as cur, cur.copy(copy_in) as copy:
            for payload in _payloads(numbers, batch):
                copy.write_row((QUEUE_NAME, TASK, json.dumps(payload)))
        return batch

    return copy_rows


def _queue_enqueue(
    queue: Queue, batch: int, conn: psycopg.Connection | None = None
) -> Callable[[], int]:
    """``Queue.enqueue`` of one job per call (on ``conn`` when given), or
    ``enqueue_many`` of ``batch``."""
    numbers = itertools.count()
    if batch == 1:

        def enqueue_one() -> int:
            queue.enqueue(TASK, {"seq": next(numbers)}, queue=QUEUE_NAME, conn=conn)
            return 1

        return enqueue_one

    def enqueue_many() -> int:
        specs = [JobSpec(TASK, payload, queue=QUEUE_NAME) for payload in _payloads(numbers, batch)]
        queue.enqueue_many(specs)
        return batch

    return enqueue_many


# -- the cases ----------------------------------------------------------------------


@contextmanager
def plain_table(url: str) -> Iterator[str]:
    """A fresh schema with the jobs table and ``plain_jobs`` beside it; yields the schema."""
    with database.run_schema(url, SCHEMA_PREFIX) as schema:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(schema_statement_in(STATEMENTS, "plain_table_create", schema))
        yield schema


def raw_case(
    url: str, settings: Settings, *, producers: int, copy: bool, batch: int
) -> dict[str, Any]:
    """Case ``raw-*``: ``producers`` autocommit connections, a thread each, adding
    ``batch`` rows per call to ``plain_jobs`` of a fresh schema by INSERT (``copy``:
    by COPY); the run's figures, verified against the table."""
    with plain_table(url) as schema, ExitStack() as stack:
        connections = [
            stack.enter_context(psycopg.connect(url, autocommit=True, connect_timeout=10))
            for _ in range(producers)
        ]
        make = _raw_copy if copy else _raw_insert
        timing = run_producers(
            [make(conn, schema, batch) for conn in connections],
            settings.seconds,
            settings.warmup,
            server_cpu_of(url),
        )
        return outcome(timing, count_rows(url, sql.Identifier(schema, "plain_jobs")))


def raw_pooled_case(url: str, settings: Settings, *, producers: int) -> dict[str, Any]:
    """Case ``raw-insert-*-pool``: ``producers`` threads, each adding one row per call
    to ``plain_jobs`` of a fresh schema on a connection of a psycopg_pool pool of as many
    autocommit connections, taken and returned per call; the run's figures, verified
    against the table."""
    with (
        plain_table(url) as schema,
        psycopg_pool.ConnectionPool(
            url,
            min_size=producers,
            max_size=producers,
            kwargs={"autocommit": True, "connect_timeout": 10},
            open=True,
        ) as pool,
    ):
        pool.wait()
        timing = run_producers(
            [_raw_insert_pooled(pool, schema) for _ in range(producers)],
            settings.seconds,
            settings.warmup,
            server_cpu_of(url),
        )
        return outcome(timing, count_rows(url, sql.Identifier(schema, "plain_jobs")))


def queue_case(
    url: str, settings: Settings, *, producers: int, batch: int, own_connections: bool = False
) -> dict[str, Any]:
    """Case ``enqueue-*``: ``producers`` threads on a pool as large, each calling
    ``Queue.enqueue`` (``batch`` 1) or ``Queue.enqueue_many`` of ``batch`` jobs, on a
    fresh schema; the run's figures, verified against the jobs table. With
    ``own_connections``, each producer passes an autocommit connection of its own as
    ``conn=``, and the pool is not used."""
    with (
        database.run_schema(url, SCHEMA_PREFIX) as schema,
        Queue.connect(url, schema=schema, min_size=producers, max_size=producers) as queue,
        ExitStack() as stack,
    ):
        connections: list[psycopg.Connection | None] = [
            stack.enter_context(psycopg.connect(url, autocommit=True, connect_timeout=10))
            if own_connections
            else None
            for _ in range(producers)
        ]
        timing = run_producers(
            [_queue_enqueue(queue, batch, conn) for conn in connections],
            settings.seconds,
            settings.warmup,
            server_cpu_of(url),
        )
        return outcome(timing, count_rows(url, sql.Identifier(schema, "jobs")))
