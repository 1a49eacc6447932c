"""pgqueue under the side-by-side protocol of ``peerlib``.

Its default worker: ``pgqueue worker`` with no tuning flags (``--burst`` to drain) and a
synchronous no-op handler (with ``--sleep-ms``, an ``async def`` one that awaits
``asyncio.sleep``), in this process: built and connected before the start barrier, as
the peers are, and run once it opens.
``--setting concurrency=N`` (or any other worker flag name) changes a default.
"""

from __future__ import annotations

import sys
from importlib import metadata

import peerlib

from pgqueue import JobSpec, Queue, migrate
from pgqueue_bench import observe

# Per-job log lines off, as in the throughput driver: the peers log nothing per job
# unless their users configure logging, so this compares queues, not log formatters.
DEFAULT_SETTINGS = {"log_level": "warning"}


def setup(url: str) -> None:
    migrate(url)


def enqueue(url: str, jobs: int) -> None:
    with Queue.connect(url, max_size=1) as queue:
        specs = [JobSpec(peerlib.NOOP_TASK, {"seq": seq}) for seq in range(jobs)]
        observe.enqueue_in_batches(queue, specs)


def produce(url: str, jobs: int, rate: float) -> None:
    import asyncio

    async def run() -> None:
        with Queue.connect(url, max_size=1) as queue:
            async for seq in peerlib.on_schedule(jobs, rate):
                queue.enqueue(peerlib.NOOP_TASK, {"seq": seq})

    asyncio.run(run())


def work(url: str, seen_file, drain: bool, settings: dict[str, str], sleep_ms: float) -> None:
    from pgqueue_worker.cli import prepare_worker, worker

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


def main() -> None:
    args = peerlib.command_line(__doc__)
    if args.command == "version":
        peerlib.print_json(
            {"pgqueue-worker": metadata.version("pgqueue-worker"), "settings": DEFAULT_SETTINGS}
        )
    elif args.command == "setup":
        setup(args.database_url)
    elif args.command == "enqueue":
        enqueue(args.database_url, args.jobs)
    elif args.command == "produce":
        produce(args.database_url, args.jobs, args.rate)
    elif args.command == "work":
        work(
            args.database_url,
            args.seen_file,
            args.drain,
            peerlib.settings(args.setting),
            args.sleep_ms,
        )
    elif args.command == "report":
        peerlib.print_json(report(args.database_url, args.latencies))


if __name__ == "__main__":
    main()
