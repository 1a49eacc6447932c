"""procrastinate under the side-by-side protocol of ``peerlib``.

Throughput settings, from procrastinate's "Execute multiple jobs at the same time"
guide: an ``async`` task and ``run_worker(concurrency=30)``, with LISTEN/NOTIFY on
(the default) and the default psycopg connector. ``--setting concurrency=N``
changes the concurrency.
"""

from __future__ import annotations

import asyncio
import signal
from importlib import metadata

import peerlib
import procrastinate

DEFAULT_SETTINGS = {"concurrency": "30"}


def make_app(url: str, seen: list[int], sleep_ms: float = 0.0) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name=peerlib.NOOP_TASK)
    async def noop(seq: int) -> None:
        if sleep_ms:
            await asyncio.sleep(sleep_ms / 1000)
        peerlib.ran(seen, seq)

    return app


async def setup(url: str) -> None:
    app = make_app(url, [])
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def enqueue(url: str, jobs: int, settings: dict[str, str]) -> None:
    peerlib.refuse_settings("procrastinate enqueue", settings)
    app = make_app(url, [])
    task = app.tasks[peerlib.NOOP_TASK]
    async with app.open_async():
        for start in range(0, jobs, 1000):
            batch = [{"seq": seq} for seq in range(start, min(jobs, start + 1000))]
            await task.batch_defer_async(*batch)


async def produce(url: str, jobs: int, rate: float) -> None:
    app = make_app(url, [])
    task = app.tasks[peerlib.NOOP_TASK]
    async with app.open_async():
        async for seq in peerlib.on_schedule(jobs, rate):
            await task.defer_async(seq=seq)


async def work(url: str, seen_file, drain: bool, settings: dict[str, str], sleep_ms: float) -> None:
    # An interrupt at the terminal is the driver's to handle; the worker stops on SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seen: list[int] = []
    app = make_app(url, seen, sleep_ms)
    chosen = {**DEFAULT_SETTINGS, **settings}
    async with app.open_async():
        await app.check_connection_async()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, peerlib.wait_for_go)
        try:
            # procrastinate installs its own SIGTERM handler: a graceful stop.
            await app.run_worker_async(
                concurrency=int(chosen["concurrency"]), wait=not drain, delete_jobs="never"
            )
        finally:
            peerlib.write_seen(seen_file, seen)


if __name__ == "__main__":
    version = {"procrastinate": metadata.version("procrastinate"), "settings": DEFAULT_SETTINGS}
    peerlib.serve(__doc__, version, report_tables="procrastinate")
