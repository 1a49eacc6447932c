"""pgqueue, procrastinate and PgQueuer side by side: the same throughput and latency
scenarios, on the same PostgreSQL server, in one run.

Each system runs from a script in ``drivers/`` (``peer_<name>.py``) that speaks the
protocol described in ``drivers/peerlib.py``, under the Python of its own virtualenv
(``nox -s peers`` builds them). Each run gets a fresh database on the server.

Throughput: ``--jobs`` no-op jobs are pre-loaded, W worker processes start, report
ready, and are released together; they drain the queue and exit. The rate runs from
the first claim to the last completion, read from the system's own tables on the
database clock. A run counts only if every job completed exactly once: the union of
the sequence numbers the processes ran is exactly 0..N-1, and the system's tables
say every job completed and none was started twice.

Latency: W workers wait for jobs while a producer enqueues ``--latency-jobs`` at
``--rate`` per second, one per transaction; pickup latency is first claim minus
enqueue, from the system's tables.

Async jobs (``--sleep-ms MS``): the throughput scenario again, with every system's
handler an ``async def`` that awaits ``asyncio.sleep`` of MS milliseconds: how many
such jobs each system runs at once with its natural settings. pgqueue keeps its
default flags. Throughput only; the results go to ``results/peers_async.json``.

Each throughput run also records its CPU per job: the worker processes' CPU seconds
from their first job to their exit, and the server's from the start barrier until the
workers' backends are gone (when the server runs on this machine), over the jobs. A
busy machine moves a rate far more than CPU seconds.

A baseline build (``--baseline LABEL=PYTHON``): today's pgqueue against an older one
installed in another virtualenv, in the same run. The system "pgqueue LABEL" runs the
same ``peer_pgqueue.py`` under PYTHON; beside it run "pgqueue", and "pgqueue
concurrency-limited" and "pgqueue rate-limited": today's pgqueue on a queue whose
``concurrency_limit`` (10,000) or ``rate_limit`` (a million jobs/s) is set but never
binds, so the cost of a configured limit shows. Those three run only when asked
(``--baseline``, or ``--only``). With ``--baseline``, only the pgqueue systems run
(``--only`` adds peers), throughput only, into ``results/peers_baseline.json``, whose
summary gives, per worker count, each pgqueue system's rate over the baseline's, paired
within each repeat (the systems take turns inside a repeat): the median of those
ratios, and their min and max; and the same for their CPU per job over the baseline's.
The summary is computed in :mod:`pgqueue_bench.peers.summary`.

The drain with partition keys (``--keys K``): "pgqueue" (no keys) against the same
jobs spread over K partition keys, so that every claim takes them round-robin by key
("pgqueue K keys"), and the same on a queue whose ``partition_concurrency_limit``
("... partition-limited") or ``partition_rate_limit`` ("... partition-rate-limited") is
set far above anything a run reaches. Only these four run (``--only`` adds others),
throughput only, into ``results/peers_partitions.json``, whose summary gives each keyed
system's rate and CPU per job over pgqueue's without keys, paired within each repeat as
for a baseline build, and ``targets``: each keyed system's median rate ratio against
:data:`~pgqueue_bench.peers.summary.KEYED_RATE_AT_LEAST`, per worker count.

Usage (what ``nox -s peers`` runs)::

    python -m pgqueue_bench.peers --peer procrastinate=PYTHON --peer pgqueuer=PYTHON

for 20 ms async jobs (``nox -s peers -- --sleep-ms 20 --workers 1``)::

    python -m pgqueue_bench.peers --peer ... --sleep-ms 20 --workers 1

against a build of commit 8adbcc3 installed in its own virtualenv::

    python -m pgqueue_bench.peers --baseline 8adbcc3=/tmp/pgqueue-8adbcc3/.venv/bin/python

and the drain with 100 partition keys against the drain without::

    python -m pgqueue_bench.peers --keys 100
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from pgqueue_bench import results
from pgqueue_bench.charts import plot
from pgqueue_bench.infra import database, environment, server_cpu
from pgqueue_bench.peers.runs import latency_run, throughput_run
from pgqueue_bench.peers.summary import keyed_targets, print_summary, summarize
from pgqueue_bench.peers.systems import (
    PARTITION_KEYS,
    described_settings,
    partition_variants,
    pgqueue_variants,
    systems,
)
from pgqueue_bench.progress import LiveLine

# Jobs per throughput run: no-op jobs drain in a fraction of a second; sleeping ones
# need more for the run to outlast the ramp-up of a thousand concurrent handlers.
NOOP_JOBS = 5000
SLEEPING_JOBS = 20000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--peer", action="append", default=[], metavar="NAME=PYTHON",
        help="The Python of a peer's virtualenv (procrastinate, pgqueuer).",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=int,
        help=f"Jobs per throughput run. Default: {NOOP_JOBS}, or {SLEEPING_JOBS} with --sleep-ms.",
    )  # fmt: skip
    parser.add_argument(
        "--sleep-ms", type=float, default=0.0, metavar="MS",
        help="Async jobs: every system's handler awaits asyncio.sleep of MS milliseconds "
        "(pgqueue's too, otherwise a plain no-op function). Throughput only, into "
        "results/peers_async.json.",
    )  # fmt: skip
    parser.add_argument("--workers", default="1,2,4", help="Worker process counts.")
    # A throughput run lasts a fraction of a second, so one slow or fast draw moves a
    # median of three: five make it steadier.
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-jobs", type=int, default=1000)
    parser.add_argument("--latency-workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2 workers, one run, fewer jobs.")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--database-url", help="Default: DATABASE_URL, else embedded.")
    parser.add_argument("--results-dir")
    parser.add_argument(
        "--only", action="append", default=[], metavar="SYSTEM",
        help="Run only this system (repeatable), e.g. --only pgqueue --only 'pgqueuer batch 100'; "
        "also 'pgqueue concurrency-limited' and 'pgqueue rate-limited', which run only when asked.",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", metavar="LABEL=PYTHON",
        help="Also run the pgqueue installed under PYTHON as 'pgqueue LABEL', with today's "
        "pgqueue on queues with non-binding limits; only pgqueue systems unless --only says "
        "otherwise, throughput only, into results/peers_baseline.json with each one's ratio "
        "to the baseline.",
    )  # fmt: skip
    parser.add_argument(
        "--keys", type=int, metavar="K",
        help="The drain with partition keys: pgqueue without keys against its jobs spread "
        "over K keys (fair share only, and with a partition concurrency or rate limit that "
        "never binds); only those systems unless --only says otherwise, throughput only, "
        "into results/peers_partitions.json with each one's ratio to pgqueue without keys.",
    )  # fmt: skip
    args = parser.parse_args(argv)

    # Absolute but not resolved: a virtualenv's python is a symlink to the base one.
    pythons = {
        name: os.path.abspath(python) for name, python in (p.split("=", 1) for p in args.peer)
    }
    baseline: tuple[str, str] | None = None
    if args.baseline:
        label, _, python = args.baseline.partition("=")
        if not label or not python:
            parser.error("--baseline takes LABEL=PYTHON, e.g. 8adbcc3=/path/to/.venv/bin/python")
        baseline = (label, os.path.abspath(python))
    if args.keys is not None and args.keys < 1:
        parser.error("--keys takes a number of partition keys, at least 1")
    if args.keys and baseline:
        parser.error("--keys and --baseline are separate runs: give one of them")
    keys = args.keys or PARTITION_KEYS
    worker_counts = [int(w) for w in args.workers.split(",")]
    sleep_ms = args.sleep_ms
    jobs = args.jobs or (SLEEPING_JOBS if sleep_ms else NOOP_JOBS)
    repeats, latency_jobs = args.repeats, args.latency_jobs
    # The async scenario measures how many sleeping jobs run at once: throughput only.
    # The baseline comparison is about drain throughput.
    no_latency = args.no_latency or bool(sleep_ms) or bool(baseline) or bool(args.keys)
    if args.quick:
        worker_counts, repeats, jobs, latency_jobs = [2], 1, min(jobs, 2000), min(latency_jobs, 300)

    standard, variants = systems(pythons), pgqueue_variants(baseline)
    keyed = partition_variants(keys)
    if args.only:
        known = standard + variants + keyed
        unknown = set(args.only) - {system.name for system in known}
        if unknown:
            parser.error(f"no such system: {', '.join(sorted(unknown))}")
        chosen = [system for system in known if system.name in args.only]
    elif baseline:
        chosen = [standard[0], *variants]
    elif args.keys:
        chosen = [standard[0], *keyed]
    else:
        chosen = standard
    missing = {system.peer for system in chosen if not system.python}
    if missing:
        parser.error(f"give --peer for {', '.join(sorted(missing))} (nox -s peers does)")
    baseline_name = f"pgqueue {baseline[0]}" if baseline else ("pgqueue" if args.keys else None)
    target = database.resolve_target(args.database_url)
    versions: dict[str, Any] = {}
    for system in chosen:
        reported: dict[str, Any] = json.loads(system.run("version").strip().splitlines()[-1])
        reported.pop("settings", None)
        if baseline and system.name == baseline_name:
            # The same distributions at another commit: keep both versions apart.
            label = baseline[0]
            reported = {f"{package} ({label})": v for package, v in reported.items()}
        versions.update(reported)
    postmaster = server_cpu.local_postmaster_pid(target.url)
    runs: list[dict[str, Any]] = []
    with LiveLine() as progress:
        # Interleave the systems inside each repeat, so a slow spell of the machine
        # does not fall on one system only, and start each repeat with the next one,
        # so that no system always runs first (or right after another one).
        for repeat in range(repeats):
            turn = repeat % len(chosen)
            for workers in worker_counts:
                for system in chosen[turn:] + chosen[:turn]:
                    progress.update(
                        f"throughput: {system.name}, {workers} workers, run {repeat + 1}/{repeats}",
                        force=True,
                    )
                    run = throughput_run(
                        system, target.url, jobs, workers, args.timeout, sleep_ms, postmaster
                    )
                    runs.append({"repeat": repeat + 1, **run})
                    rate = run["jobs_per_second"]
                    progress.log(
                        f"{system.name:>20} x{workers}: {rate:,.0f} jobs/s"
                        + ("" if run["verified"] else f" (not counted: {run['problems']})")
                    )
            if no_latency:
                continue
            for system in chosen:
                progress.update(f"latency: {system.name}, run {repeat + 1}/{repeats}", force=True)
                run = latency_run(
                    system, target.url, latency_jobs, args.rate, args.latency_workers, args.timeout
                )
                runs.append({"repeat": repeat + 1, **run})
                lat = run["latency_ms"]
                progress.log(
                    f"{system.name:>20} latency: p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms"
                )
    names = [system.name for system in chosen]
    summary = summarize(runs, names, baseline_name)
    block = environment.describe(target.url, target.server, **versions)
    parameters = {
        "jobs": jobs,
        "sleep_ms": sleep_ms,
        "worker_counts": worker_counts,
        "repeats": repeats,
        "latency_jobs": latency_jobs,
        "latency_workers": args.latency_workers,
        "rate": args.rate,
        "systems": described_settings(names, sleep_ms, keys),
    }
    if baseline:
        parameters["systems"][baseline_name] = (
            f"as pgqueue, the build of {baseline[0]} in a virtualenv of its own"
        )
        parameters["baseline"] = {"label": baseline[0], "python": baseline[1]}
        name = "peers_baseline_async" if sleep_ms else "peers_baseline"
    elif args.keys:
        parameters["partition_keys"] = keys
        summary["targets"] = keyed_targets(summary, [system.name for system in keyed])
        name = "peers_partitions_async" if sleep_ms else "peers_partitions"
    else:
        name = "peers_async" if sleep_ms else "peers"
    document = results.document(
        name, environment=block, parameters=parameters, runs=runs, summary=summary
    )
    path = results.write(name, document, args.results_dir)
    print(f"wrote {path}")
    print_summary(summary, baseline_name)
    # The charts show the no-op scenario with the peers.
    if not sleep_ms and not baseline and not args.keys:
        for image in plot.plot_peers(document, path.parent):
            print(f"wrote {image}")


if __name__ == "__main__":
    main()
