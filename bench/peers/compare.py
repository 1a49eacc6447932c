"""pgqueue, procrastinate and PgQueuer side by side: the same throughput and latency
scenarios, on the same PostgreSQL server, in one run.

Each system runs from a script in this folder (``peer_<name>.py``) that speaks the
protocol described in ``peerlib.py``, under the Python of its own virtualenv
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
The summary is computed in ``peers_summary.py``.

Usage (what ``nox -s peers`` runs)::

    python bench/peers/compare.py --peer procrastinate=PYTHON --peer pgqueuer=PYTHON

for 20 ms async jobs (``nox -s peers -- --sleep-ms 20 --workers 1``)::

    python bench/peers/compare.py --peer ... --sleep-ms 20 --workers 1

and against a build of commit 8adbcc3 installed in its own virtualenv::

    python bench/peers/compare.py --baseline 8adbcc3=/tmp/pgqueue-8adbcc3/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peerlib
from peers_summary import print_summary, summarize

from pgqueue_bench import database, environment, plot, results, server_cpu
from pgqueue_bench.latency import percentiles
from pgqueue_bench.progress import LiveLine

HERE = Path(__file__).resolve().parent
# Jobs per throughput run: no-op jobs drain in a fraction of a second; sleeping ones
# need more for the run to outlast the ramp-up of a thousand concurrent handlers.
NOOP_JOBS = 5000
SLEEPING_JOBS = 20000


@dataclass(frozen=True)
class System:
    """One queue under test, with the settings it runs with."""

    name: str
    peer: str
    settings: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable

    @property
    def script(self) -> Path:
        return HERE / f"peer_{self.peer}.py"

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in self.name.lower())

    def command(self, *args: str) -> list[str]:
        return [self.python, str(self.script), *args]

    def run(self, *args: str, timeout: float = 300) -> str:
        """Run one subcommand to completion; return its output."""
        done = subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, cwd=HERE
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} {args[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def report(self, url: str, *, latencies: bool = False) -> dict[str, Any]:
        args = ["report", "--database-url", url] + (["--latencies"] if latencies else [])
        return json.loads(self.run(*args).strip().splitlines()[-1])

    def setting_args(self) -> list[str]:
        return [
            arg for name, value in self.settings.items() for arg in ("--setting", f"{name}={value}")
        ]


# Limits configured on the queue but far above what a run reaches: what the claim
# pays for reading and keeping them, not what they hold back.
UNBOUND_CONCURRENCY_LIMIT = 10_000
UNBOUND_RATE_LIMIT = 1_000_000


def systems(pythons: dict[str, str]) -> list[System]:
    """pgqueue with its default worker, and each peer with its documented throughput
    settings; PgQueuer also with the larger batch its tuning guide suggests for
    short jobs, so the comparison is against its best documented configuration.
    (A peer whose Python was not given has an empty one; it cannot be chosen.)"""
    return [
        System("pgqueue", "pgqueue"),
        System("procrastinate", "procrastinate", python=pythons.get("procrastinate", "")),
        System("pgqueuer", "pgqueuer", python=pythons.get("pgqueuer", "")),
        System(
            "pgqueuer batch 100",
            "pgqueuer",
            {"batch_size": "100"},
            python=pythons.get("pgqueuer", ""),
        ),
    ]


def pgqueue_variants(baseline: tuple[str, str] | None) -> list[System]:
    """The systems that run only when asked: today's pgqueue on a queue with a
    concurrency limit or a rate limit that never binds, and, given ``(label,
    python)``, the pgqueue installed under that Python as "pgqueue LABEL"."""
    variants = [
        System(
            "pgqueue concurrency-limited",
            "pgqueue",
            {"queue_concurrency_limit": str(UNBOUND_CONCURRENCY_LIMIT)},
        ),
        System("pgqueue rate-limited", "pgqueue", {"queue_rate_limit": str(UNBOUND_RATE_LIMIT)}),
    ]
    if baseline:
        label, python = baseline
        variants.append(System(f"pgqueue {label}", "pgqueue", python=python))
    return variants


class Workers:
    """W ``work`` processes of one system, started behind a barrier."""

    def __init__(
        self,
        system: System,
        url: str,
        count: int,
        folder: Path,
        *,
        drain: bool,
        sleep_ms: float = 0.0,
    ) -> None:
        self.seen_files = [folder / f"seen-{n}.txt" for n in range(count)]
        self.processes = []
        for n, seen in enumerate(self.seen_files):
            log = (folder / f"worker-{n}.log").open("w")
            args = ["work", "--database-url", url, "--seen-file", str(seen), *system.setting_args()]
            if sleep_ms:
                args += ["--sleep-ms", f"{sleep_ms:g}"]
            self.processes.append(
                subprocess.Popen(
                    system.command(*args, *(["--drain"] if drain else [])),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    cwd=HERE,
                )
            )
            log.close()
        self.folder = folder

    def release(self, timeout: float = 120) -> None:
        """Wait until every process said ready, then let them all go at once."""
        self.wait_until_ready(timeout)
        self.go()

    def wait_until_ready(self, timeout: float = 120) -> None:
        """Wait until every process has connected and said ready."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or process.poll() is not None:
                    raise RuntimeError(f"a worker did not get ready:\n{self.log_tail()}")
                readable, _, _ = select.select([process.stdout], [], [], remaining)
                if readable and process.stdout.readline().strip() == "ready":
                    break

    def go(self) -> None:
        """Open the start barrier: every ready process starts at once."""
        for process in self.processes:
            process.stdin.write("go\n")
            process.stdin.flush()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.wait(max(0.1, deadline - time.monotonic()))
        failed = [p.returncode for p in self.processes if p.returncode != 0]
        if failed:
            raise RuntimeError(f"workers exited with {failed}:\n{self.log_tail()}")

    def stop(self, timeout: float = 60) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        self.wait(timeout)

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    def seen(self) -> list[int]:
        numbers: list[int] = []
        for path in self.seen_files:
            if path.exists():
                numbers += [int(line) for line in path.read_text().split()]
        return numbers

    def cpu_seconds(self) -> float | None:
        """The CPU seconds the processes used from their first job (each writes its own
        at exit, see ``peerlib.write_seen``), or None if one did not."""
        paths = [peerlib.cpu_path(path) for path in self.seen_files]
        if not all(path.exists() for path in paths):
            return None
        return sum(float(path.read_text()) for path in paths)

    def log_tail(self) -> str:
        return "\n".join(
            path.read_text()[-1500:] for path in sorted(self.folder.glob("worker-*.log"))
        )


def verify(seen: list[int], jobs: int, report: dict[str, Any]) -> list[str]:
    """Why a run does not count, or nothing if every job completed exactly once."""
    problems = []
    if sorted(seen) != list(range(jobs)):
        missing = jobs - len(set(seen) & set(range(jobs)))
        problems.append(f"{missing} jobs never ran, {len(seen) - len(set(seen))} ran twice")
    if report["completed"] != jobs:
        problems.append(f"the tables say {report['completed']} of {jobs} jobs completed")
    if report["most_starts_of_one_job"] > 1:
        problems.append("the tables say some job was started more than once")
    return problems


def throughput_run(
    system: System,
    server_url: str,
    jobs: int,
    workers: int,
    timeout: float,
    sleep_ms: float = 0.0,
    postmaster: int | None = None,
) -> dict[str, Any]:
    """Drain ``jobs`` pre-loaded jobs with ``workers`` processes; the rate and checks.
    With ``sleep_ms``, each job's handler awaits ``asyncio.sleep`` of that long.

    The CPU the drain cost, per job: the worker processes' from their first job to
    their exit (see ``peerlib.ran``), and, given the ``postmaster`` of a server on this
    machine, the server's from the start barrier until the workers' backends are gone.
    Other programs on the machine slow a run's rate far more than its CPU seconds."""
    database_name = f"bench_peer_{system.slug}"
    server_seconds = None
    with (
        database.fresh_database(server_url, database_name) as url,
        tempfile.TemporaryDirectory(prefix="pgqueue-peers-") as folder,
    ):
        system.run("setup", "--database-url", url)
        system.run("enqueue", "--database-url", url, "--jobs", str(jobs))
        fleet = Workers(system, url, workers, Path(folder), drain=True, sleep_ms=sleep_ms)
        try:
            fleet.wait_until_ready()
            server_before = server_cpu_seconds(postmaster)
            fleet.go()
            fleet.wait(timeout)
            if postmaster is not None and server_before is not None:
                wait_for_backends_to_leave(postmaster, database_name)
                server_seconds = server_cpu_seconds(postmaster) - server_before
        finally:
            fleet.kill()
        worker_cpu = fleet.cpu_seconds()
        report = system.report(url)
        problems = verify(fleet.seen(), jobs, report)
    seconds = report["seconds"]
    cpu = None if worker_cpu is None or server_seconds is None else worker_cpu + server_seconds
    return {
        "scenario": "throughput",
        "system": system.name,
        "workers": workers,
        "jobs": jobs,
        "sleep_ms": sleep_ms,
        "seconds": seconds,
        "jobs_per_second": jobs / seconds if seconds else None,
        "worker_cpu_seconds": worker_cpu,
        "server_cpu_seconds": server_seconds,
        "cpu_us_per_job": None if cpu is None else cpu / jobs * 1e6,
        "verified": not problems,
        "problems": problems,
    }


def server_cpu_seconds(postmaster: int | None) -> float | None:
    """The server's CPU seconds so far, or None for a server not on this machine."""
    return None if postmaster is None else server_cpu.postgres_cpu_seconds(postmaster)


def wait_for_backends_to_leave(postmaster: int, database_name: str, timeout: float = 10) -> None:
    """Wait until no backend serves ``database_name``: the time of a backend that has
    exited counts once the postmaster has reaped it."""
    deadline = time.monotonic() + timeout
    while server_cpu.backends_of(postmaster, database_name) and time.monotonic() < deadline:
        time.sleep(0.05)


def latency_run(
    system: System, server_url: str, jobs: int, rate: float, workers: int, timeout: float
) -> dict[str, Any]:
    """Pickup latency of ``jobs`` jobs enqueued at ``rate`` per second."""
    with (
        database.fresh_database(server_url, f"bench_peer_{system.slug}") as url,
        tempfile.TemporaryDirectory(prefix="pgqueue-peers-") as folder,
    ):
        system.run("setup", "--database-url", url)
        fleet = Workers(system, url, workers, Path(folder), drain=False)
        try:
            fleet.release()
            time.sleep(1.0)  # let every worker settle into waiting for jobs
            system.run(
                "produce", "--database-url", url, "--jobs", str(jobs), "--rate", str(rate),
                timeout=timeout,
            )  # fmt: skip
            deadline = time.monotonic() + timeout
            while system.report(url)["completed"] < jobs and time.monotonic() < deadline:
                time.sleep(0.5)
            fleet.stop()
        finally:
            fleet.kill()
        report = system.report(url, latencies=True)
        problems = verify(fleet.seen(), jobs, report)
    return {
        "scenario": "latency",
        "system": system.name,
        "workers": workers,
        "jobs": jobs,
        "rate": rate,
        "latency_ms": percentiles(report["latencies_ms"]),
        "verified": not problems,
        "problems": problems,
    }


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
    worker_counts = [int(w) for w in args.workers.split(",")]
    sleep_ms = args.sleep_ms
    jobs = args.jobs or (SLEEPING_JOBS if sleep_ms else NOOP_JOBS)
    repeats, latency_jobs = args.repeats, args.latency_jobs
    # The async scenario measures how many sleeping jobs run at once: throughput only.
    # The baseline comparison is about drain throughput.
    no_latency = args.no_latency or bool(sleep_ms) or bool(baseline)
    if args.quick:
        worker_counts, repeats, jobs, latency_jobs = [2], 1, min(jobs, 2000), min(latency_jobs, 300)

    standard, variants = systems(pythons), pgqueue_variants(baseline)
    if args.only:
        known = standard + variants
        unknown = set(args.only) - {system.name for system in known}
        if unknown:
            parser.error(f"no such system: {', '.join(sorted(unknown))}")
        chosen = [system for system in known if system.name in args.only]
    elif baseline:
        chosen = [standard[0], *variants]
    else:
        chosen = standard
    missing = {system.peer for system in chosen if not system.python}
    if missing:
        parser.error(f"give --peer for {', '.join(sorted(missing))} (nox -s peers does)")
    baseline_name = f"pgqueue {baseline[0]}" if baseline else None
    target = database.resolve_target(args.database_url)
    versions: dict[str, Any] = {}
    for system in chosen:
        reported = json.loads(system.run("version").strip().splitlines()[-1])
        reported.pop("settings", None)
        if system.name == baseline_name:
            # The same distributions at another commit: keep both versions apart.
            reported = {f"{package} ({baseline[0]})": v for package, v in reported.items()}
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
    block = environment.describe(target.url, target.server)
    block["packages"].update(versions)
    if sleep_ms:
        sleep = f"asyncio.sleep({sleep_ms / 1000:g})"
        handler, peer_handler = f"async handler awaiting {sleep}", f" awaiting {sleep}"
    else:
        handler, peer_handler = "sync no-op handler", ""
    parameters = {
        "jobs": jobs,
        "sleep_ms": sleep_ms,
        "worker_counts": worker_counts,
        "repeats": repeats,
        "latency_jobs": latency_jobs,
        "latency_workers": args.latency_workers,
        "rate": args.rate,
        "systems": {
            "pgqueue": "pgqueue worker --burst with its defaults and --log-level warning "
            f"(no log line per job), {handler}, connected before the start barrier "
            "as every peer is",
            "procrastinate": f"async task{peer_handler}, run_worker(concurrency=30), "
            "LISTEN/NOTIFY on, PsycopgConnector (its concurrency how-to)",
            "pgqueuer": f"async entrypoint{peer_handler} (no concurrency_limit: its default), "
            "AsyncpgDriver, durable tables, batch_size=10 (its default and its benchmark tool's)",
            "pgqueuer batch 100": "as pgqueuer, batch_size=100 (its tuning guide: a larger "
            "batch for short jobs)",
        },
    }
    asked_for = {
        "pgqueue concurrency-limited": "as pgqueue, on a queue whose concurrency_limit is "
        f"{UNBOUND_CONCURRENCY_LIMIT} (set with Queue.update_queue before the start barrier)",
        "pgqueue rate-limited": f"as pgqueue, on a queue whose rate_limit is "
        f"{UNBOUND_RATE_LIMIT:g} jobs/s (set with Queue.update_queue before the start barrier)",
    }
    parameters["systems"].update({k: v for k, v in asked_for.items() if k in names})
    if baseline:
        parameters["systems"][baseline_name] = (
            f"as pgqueue, the build of {baseline[0]} in a virtualenv of its own"
        )
        parameters["baseline"] = {"label": baseline[0], "python": baseline[1]}
        name = "peers_baseline_async" if sleep_ms else "peers_baseline"
    else:
        name = "peers_async" if sleep_ms else "peers"
    document = results.document(
        name, environment=block, parameters=parameters, runs=runs, summary=summary
    )
    path = results.write(name, document, args.results_dir)
    print(f"wrote {path}")
    print_summary(summary, baseline_name)
    if not sleep_ms and not baseline:  # the charts show the no-op scenario with the peers
        for image in plot.plot_peers(document, path.parent):
            print(f"wrote {image}")


if __name__ == "__main__":
    main()
