"""pgqueue under the side-by-side protocol of ``peerlib``.

Its default worker: ``pgqueue worker`` with no tuning flags (``--burst`` to drain) and a
synchronous no-op handler (with ``--sleep-ms``, an ``async def`` one that awaits
``asyncio.sleep``), in this process: built and connected before the start barrier, as
the peers are, and run once it opens.
``--setting concurrency=N`` (or any other worker flag name) changes a default.

``--setting queue_concurrency_limit=N`` and ``--setting queue_rate_limit=R`` (and
``queue_partition_concurrency_limit``, ``queue_partition_rate_limit``) are not worker
flags but the queue's own settings: each ``work`` process applies them with
``Queue.update_queue`` before the start barrier (the same values from every process).
``enqueue --setting partition_keys=K`` gives the jobs K partition keys, in turn
(``key-000``, ``key-001``, ...). Nothing else here needs a newer pgqueue than commit
8adbcc3, so the script also runs under such an older build installed in another
virtualenv (``python -m pgqueue_bench.peers --baseline``).
"""

from __future__ import annotations

import sys
from importlib import metadata

import peerlib

from pgqueue import JobSpec, Queue, migrate
from pgqueue.settings import DEFAULT_QUEUE
from pgqueue_bench.verdict import observe

# Per-job log lines off, as in the throughput driver: the peers log nothing per job
# unless their users configure logging, so this compares queues, not log formatters.
DEFAULT_SETTINGS = {"log_level": "warning"}

# Settings of the queue, not of the worker: the update_queue argument each one sets,
# and how its value is read.
QUEUE_SETTINGS = {
    "queue_concurrency_limit": ("concurrency_limit", int),
    "queue_rate_limit": ("rate_limit", float),
    "queue_partition_concurrency_limit": ("partition_concurrency_limit", int),
    "queue_partition_rate_limit": ("partition_rate_limit", float),
}


def setup(url: str) -> None:
    migrate(url)


def enqueue(url: str, jobs: int, settings: dict[str, str]) -> None:
    keys = int(settings.pop("partition_keys", 0))
    peerlib.refuse_settings("pgqueue enqueue", settings)

    def spec(seq: int) -> JobSpec:
        if not keys:  # no partition_key argument at all: older builds have none
            return JobSpec(peerlib.NOOP_TASK, {"seq": seq})
        return JobSpec(peerlib.NOOP_TASK, {"seq": seq}, partition_key=f"key-{seq % keys:03d}")

    with Queue.connect(url, max_size=1) as queue:
        observe.enqueue_in_batches(queue, [spec(seq) for seq in range(jobs)])


def produce(url: str, jobs: int, rate: float) -> None:
    import asyncio

    async def run() -> None:
        with Queue.connect(url, max_size=1) as queue:
            async for seq in peerlib.on_schedule(jobs, rate):
                queue.enqueue(peerlib.NOOP_TASK, {"seq": seq})

    asyncio.run(run())


def configure_queue(url: str, settings: dict[str, str]) -> dict[str, str]:
    """Apply the queue settings among ``settings`` (see :data:`QUEUE_SETTINGS`) to the
    queue the worker serves; return the others, the worker's flags."""
    changes = {
        QUEUE_SETTINGS[name][0]: QUEUE_SETTINGS[name][1](value)
        for name, value in settings.items()
        if name in QUEUE_SETTINGS
    }
    flags = {name: value for name, value in settings.items() if name not in QUEUE_SETTINGS}
    if changes:
        with Queue.connect(url, max_size=1) as queue:
            if not hasattr(queue, "update_queue"):
                raise SystemExit(f"this pgqueue has no queue settings: cannot set {changes}")
            # create: the jobs are there already, but a queue need not have any yet.
            queue.update_queue(flags.get("queue", DEFAULT_QUEUE), **changes, create=True)
    return flags


def work(url: str, seen_file, drain: bool, settings: dict[str, str], sleep_ms: float) -> None:
    from pgqueue_worker.cli import prepare_worker, worker

    settings = configure_queue(url, settings)
    handlers = "peerlib:PGQUEUE_HANDLERS"
    if sleep_ms:
        peerlib.SLEEP_SECONDS = sleep_ms / 1000
        handlers = "peerlib:PGQUEUE_ASYNC_HANDLERS"
    args = ["--database-url", url, "--handlers", handlers]
    for name, value in {**DEFAULT_SETTINGS, **settings}.items():
        args += [f"--{name.replace('_', '-')}", value]
    if drain:
        args.append("--burst")
    # `pgqueue worker` in two steps, so that it connects, loads its plugins and checks
    # the schema before the barrier, as the peers connect before it: the barrier then
    # releases every system's processing, not its start-up.
    prepared = prepare_worker(**worker.make_context("worker", args).params)
    peerlib.wait_for_go()
    try:
        code = prepared.serve()
    finally:
        peerlib.write_seen(seen_file, peerlib.SEEN)
    sys.exit(code)


def report(url: str, latencies: bool) -> dict:
    with Queue.connect(url, max_size=1) as queue:
        jobs = observe.all_jobs(queue)
    done = [job for job in jobs if job.finished_at is not None and job.state == "succeeded"]
    out = {
        "completed": len(done),
        "most_starts_of_one_job": max((job.attempts for job in jobs), default=0),
        # Read with getattr: an older build's jobs have no partition key.
        "partition_keys": len({getattr(job, "partition_key", None) for job in jobs} - {None}),
        "seconds": (
            (max(j.finished_at for j in done) - min(j.started_at for j in done)).total_seconds()
            if done
            else None
        ),
    }
    if latencies:
        out["latencies_ms"] = [
            (job.started_at - max(job.run_at, job.enqueued_at)).total_seconds() * 1000
            for job in jobs
            if job.started_at is not None and job.attempts == 1
        ]
    return out


if __name__ == "__main__":
    version = {"pgqueue-worker": metadata.version("pgqueue-worker"), "settings": DEFAULT_SETTINGS}
    peerlib.serve(__doc__, version)
