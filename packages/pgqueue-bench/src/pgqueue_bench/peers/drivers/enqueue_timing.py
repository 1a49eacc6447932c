"""What the peers' enqueue scripts (``enqueue_<peer>.py``) share, for ``pgqueue bench
enqueue``. Standard library only: each runs in its peer's own virtualenv.

Every script takes the same options and prints one line of JSON: the jobs and calls of
the measured time, its length in seconds, and the jobs added while warming up. The
driver counts the peer's table afterwards against those numbers.

    python enqueue_pgqueuer.py --database-url URL --batch-size 1 --seconds 5 --warmup 1
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import peerlib


def command_line(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The options every enqueue script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--database-url", required=True)
    parser.add_argument(
        "--batch-size", type=int, default=1, help="Jobs per call; 1 is the single-job call."
    )
    parser.add_argument("--seconds", type=float, required=True, help="Measured time.")
    parser.add_argument("--warmup", type=float, default=1.0, help="Unmeasured time first.")
    return parser.parse_args(argv)


async def timed(
    enqueue: Callable[[int], Awaitable[int]], seconds: float, warmup: float
) -> dict[str, float | int]:
    """Await ``enqueue(first_sequence_number)`` again and again: once, then until
    ``warmup`` has passed, then for ``seconds``. Each call returns the jobs it added."""
    sequence = 0
    warm_until = time.perf_counter() + warmup
    while True:
        sequence += await enqueue(sequence)
        if time.perf_counter() >= warm_until:
            break
    warmup_jobs, calls = sequence, 0
    start = time.perf_counter()
    while time.perf_counter() < start + seconds:
        sequence += await enqueue(sequence)
        calls += 1
    return {
        "jobs": sequence - warmup_jobs,
        "calls": calls,
        "seconds": time.perf_counter() - start,
        "warmup_jobs": warmup_jobs,
    }


def main(description: str, measure: Callable[[str, int, float, float], Awaitable[dict]]) -> None:
    """Parse the options, run ``measure(url, batch_size, seconds, warmup)`` and print
    what it returns, the one line the driver reads."""
    args = command_line(description)
    peerlib.print_json(
        asyncio.run(measure(args.database_url, args.batch_size, args.seconds, args.warmup))
    )
