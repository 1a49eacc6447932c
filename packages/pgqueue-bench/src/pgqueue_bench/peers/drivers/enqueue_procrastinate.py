"""procrastinate's enqueue, timed for ``pgqueue bench enqueue`` (see ``enqueue_timing``).

The app of ``peer_procrastinate`` (``PsycopgConnector``, its default): with
``--batch-size 1`` one ``defer_async`` per job, as an application defers one job per
request; otherwise ``batch_defer_async`` of that many jobs per call.
"""

from __future__ import annotations

import enqueue_timing
import peer_procrastinate
import peerlib


async def measure(url: str, batch: int, seconds: float, warmup: float) -> dict:
    app = peer_procrastinate.make_app(url, [])
    task = app.tasks[peerlib.NOOP_TASK]

    async def defer_one(sequence: int) -> int:
        await task.defer_async(seq=sequence)
        return 1

    async def defer_batch(sequence: int) -> int:
        await task.batch_defer_async(*({"seq": n} for n in range(sequence, sequence + batch)))
        return batch

    async with app.open_async():
        chosen = defer_one if batch == 1 else defer_batch
        return await enqueue_timing.timed(chosen, seconds, warmup)


if __name__ == "__main__":
    enqueue_timing.main(__doc__, measure)
