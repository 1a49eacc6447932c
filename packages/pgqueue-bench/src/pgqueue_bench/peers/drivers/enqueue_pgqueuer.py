"""PgQueuer's enqueue, timed for ``pgqueue bench enqueue`` (see ``enqueue_timing``).

``Queries.enqueue`` on one asyncpg connection (``AsyncpgDriver``, the driver of its
benchmark tool): with ``--batch-size 1`` one job per call, as an application enqueues
one job per request; otherwise lists of that many jobs per call, its batch form.
"""

from __future__ import annotations

import json

import asyncpg
import enqueue_timing
import peerlib
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries


def _payload(sequence: int) -> bytes:
    return json.dumps({"seq": sequence}).encode()


async def measure(url: str, batch: int, seconds: float, warmup: float) -> dict:
    connection = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(connection))

        async def enqueue_one(sequence: int) -> int:
            await queries.enqueue(peerlib.NOOP_TASK, _payload(sequence))
            return 1

        async def enqueue_batch(sequence: int) -> int:
            numbers = range(sequence, sequence + batch)
            await queries.enqueue(
                [peerlib.NOOP_TASK] * batch, [_payload(n) for n in numbers], [0] * batch
            )
            return batch

        chosen = enqueue_one if batch == 1 else enqueue_batch
        return await enqueue_timing.timed(chosen, seconds, warmup)
    finally:
        await connection.close()


if __name__ == "__main__":
    enqueue_timing.main(__doc__, measure)
