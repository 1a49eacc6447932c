"""PgQueuer under the side-by-side protocol of ``peerlib``.

Throughput settings, from PgQueuer's benchmark and performance-tuning pages: the
asyncpg driver on one connection (``AsyncpgDriver``, which its benchmark tool uses
by default), an ``async`` entrypoint, durable (logged) tables, and ``batch_size=10``,
its default and the benchmark tool's. ``--setting batch_size=N`` changes the batch.
Its entrypoints run as asyncio tasks with no limit of their own (``concurrency_limit``
left at its default), which ``--sleep-ms`` jobs show.
"""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from importlib import metadata

import asyncpg
import peerlib
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

DEFAULT_SETTINGS = {"batch_size": "10", "driver": "asyncpg"}


async def setup(url: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def enqueue(url: str, jobs: int, settings: dict[str, str]) -> None:
    peerlib.refuse_settings("pgqueuer enqueue", settings)
    connection = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(connection))
        for start in range(0, jobs, 1000):
            seqs = range(start, min(jobs, start + 1000))
            await queries.enqueue(
                [peerlib.NOOP_TASK] * len(seqs),
                [str(seq).encode() for seq in seqs],
                [0] * len(seqs),
            )
    finally:
        await connection.close()


async def produce(url: str, jobs: int, rate: float) -> None:
    connection = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(connection))
        async for seq in peerlib.on_schedule(jobs, rate):
            await queries.enqueue(peerlib.NOOP_TASK, str(seq).encode())
    finally:
        await connection.close()


async def work(url: str, seen_file, drain: bool, settings: dict[str, str], sleep_ms: float) -> None:
    chosen = {**DEFAULT_SETTINGS, **settings}
    seen: list[int] = []
    connection = await asyncpg.connect(url)
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(peerlib.NOOP_TASK)
    async def noop(job: Job) -> None:
        if sleep_ms:
            await asyncio.sleep(sleep_ms / 1000)
        peerlib.ran(seen, int(job.payload))

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, pgq.shutdown.set)
    await loop.run_in_executor(None, peerlib.wait_for_go)
    try:
        await pgq.run(
            batch_size=int(chosen["batch_size"]),
            mode=QueueExecutionMode.drain if drain else QueueExecutionMode.continuous,
            dequeue_timeout=timedelta(seconds=30),
        )
    finally:
        peerlib.write_seen(seen_file, seen)
        if not connection.is_closed():
            await connection.close()


if __name__ == "__main__":
    version = {"pgqueuer": metadata.version("pgqueuer"), "settings": DEFAULT_SETTINGS}
    peerlib.serve(__doc__, version, report_tables="pgqueuer")
