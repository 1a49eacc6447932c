"""The enqueue driver: how fast jobs get in, beside what the same server takes from raw
SQL and from the peers, all in one run on one server.

Cases, each measured for ``--seconds`` after a warm-up of ``--warmup`` seconds (every
producer makes at least one call in it), each on a fresh schema, or for the peers a
fresh database:

- raw SQL into ``plain_jobs``, a table created ``LIKE`` active_jobs (its columns,
  defaults, constraints and indexes, no triggers), on autocommit connections:
  one prepared ``INSERT ... RETURNING id`` per transaction on one connection
  (``raw-insert-1``) and on ``--connections`` connections (16 unless told), a thread
  each (``raw-insert-16``); the same, each row on a connection taken from a
  psycopg_pool pool of autocommit connections and returned after it
  (``raw-insert-1-pool``, ``raw-insert-16-pool``: what the pool alone costs per
  checkout); ``--batch-size`` rows per statement from arrays (``raw-multirow``) and
  per ``COPY`` (``raw-copy``);
- pgqueue: ``Queue.enqueue`` on a pool of one connection (``enqueue-1``), on an
  autocommit connection of the producer's own passed as ``conn=``, so that no call
  takes a connection from the pool (``enqueue-1-own-connection``), and from
  ``--connections`` threads on a pool as large (``enqueue-16``); ``Queue.enqueue_many``
  of ``--batch-size`` jobs per call (``enqueue-many``);
- its HTTP API, ``pgqueue-api --workers 2``, driven by ``wrk`` (one thread,
  ``--connections`` keep-alive connections; a C load generator, so the client costs
  the server's machine little): ``POST /jobs`` (``http-jobs``) and ``POST /jobs/batch``
  of ``--http-batch-size`` jobs (``http-batch``);
- the peers, each from its own virtualenv (``--peer NAME=PYTHON``, as ``nox -s enqueue``
  passes): PgQueuer's ``Queries.enqueue`` and procrastinate's ``defer_async``, one job
  per call and ``--batch-size`` per call (``pgqueue_bench/peers/drivers/enqueue_*.py``).

Rates are jobs over the client's wall-clock time, from the moment every producer has
warmed up to the moment the last one's last call returned. A run counts only when the
table then holds exactly the jobs the run counted (warm-up included): a broken run is
never reported as a fast one. For HTTP, wrk counts answers; requests still in flight
when it stops may have committed too, so up to one request per connection and wrk
run more is allowed, and every error (a refused connection, a non-2xx answer, a timeout) voids the
run. Cases take turns within each repeat, so a slow spell of a shared machine does not
fall on one case only; each run records the load average it ended with.

A case that cannot run here (no ``wrk`` on the PATH, no ``--peer`` for a peer) is
skipped with its reason printed and recorded; nothing stands in for it.

The driver's parts, one job each: :mod:`~pgqueue_bench.scenarios.enqueue.settings` (the
run's settings and tools), :mod:`~pgqueue_bench.scenarios.enqueue.outcome` (timings and
their check against the table), :mod:`~pgqueue_bench.scenarios.enqueue.producers` (raw
SQL and pgqueue, in threads), :mod:`~pgqueue_bench.scenarios.enqueue.http` (wrk),
:mod:`~pgqueue_bench.scenarios.enqueue.peers` and
:mod:`~pgqueue_bench.scenarios.enqueue.summary`. This module names the cases, runs one,
says which cannot run here, and holds the command.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import click

from pgqueue_bench import results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.enqueue.http import http_case, wrk_version
from pgqueue_bench.scenarios.enqueue.peers import PEERS, peer_case, peer_pythons, peer_versions
from pgqueue_bench.scenarios.enqueue.producers import queue_case, raw_case, raw_pooled_case
from pgqueue_bench.scenarios.enqueue.settings import Settings, Tools
from pgqueue_bench.scenarios.enqueue.summary import (
    describe_bound,
    describe_ratio,
    describe_run,
    summarize,
)


@dataclass(frozen=True)
class Case:
    """One measurement: its name in the results, what it needs, and how it reads."""

    name: str
    needs: str  # "" (this environment), "wrk", or a peer's name
    label: Callable[[Settings], str]


CASES = (
    Case("raw-insert-1", "", lambda s: "raw INSERT, one row per transaction, 1 connection"),
    Case(
        "raw-insert-16",
        "",
        lambda s: f"raw INSERT, one row per transaction, {s.connections} connections",
    ),
    Case(
        "raw-insert-1-pool",
        "",
        lambda s: "raw INSERT, one row per transaction, a pool of 1, checked out per row",
    ),
    Case(
        "raw-insert-16-pool",
        "",
        lambda s: (
            f"raw INSERT, one row per transaction, {s.connections} threads, a pool of "
            f"{s.connections}, checked out per row"
        ),
    ),
    Case("enqueue-1", "", lambda s: "`Queue.enqueue`, one job per call, 1 connection"),
    Case(
        "enqueue-1-own-connection",
        "",
        lambda s: "`Queue.enqueue(conn=)`, one job per call, the caller's autocommit connection",
    ),
    Case(
        "enqueue-16",
        "",
        lambda s: f"`Queue.enqueue`, one job per call, {s.connections} threads",
    ),
    Case(
        "raw-multirow",
        "",
        lambda s: f"raw multi-row INSERT, {s.batch_size:,} rows per statement",
    ),
    Case("raw-copy", "", lambda s: f"raw COPY, {s.batch_size:,} rows per transaction"),
    Case("enqueue-many", "", lambda s: f"`Queue.enqueue_many`, {s.batch_size:,} jobs per call"),
    Case(
        "http-jobs",
        "wrk",
        lambda s: f"`POST /jobs`, {s.connections} connections, {s.api_workers} API processes",
    ),
    Case(
        "http-batch",
        "wrk",
        lambda s: (
            f"`POST /jobs/batch`, {s.http_batch_size:,} jobs per request, "
            f"{s.connections} connections"
        ),
    ),
    Case("pgqueuer-single", "pgqueuer", lambda s: "PgQueuer `enqueue`, one job per call"),
    Case(
        "pgqueuer-batch",
        "pgqueuer",
        lambda s: f"PgQueuer `enqueue`, {s.batch_size:,} jobs per call",
    ),
    Case(
        "procrastinate-single",
        "procrastinate",
        lambda s: "procrastinate `defer_async`, one job per call",
    ),
    Case(
        "procrastinate-batch",
        "procrastinate",
        lambda s: f"procrastinate `batch_defer_async`, {s.batch_size:,} jobs per call",
    ),
)
CASE_NAMES = tuple(case.name for case in CASES)


def run_case(name: str, url: str, settings: Settings, tools: Tools) -> dict[str, Any]:
    """Measure case ``name`` once on a fresh schema (peers: a fresh database)."""
    batch = settings.batch_size
    n = settings.connections
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "raw-insert-1": lambda: raw_case(url, settings, producers=1, copy=False, batch=1),
        "raw-insert-16": lambda: raw_case(url, settings, producers=n, copy=False, batch=1),
        "raw-insert-1-pool": lambda: raw_pooled_case(url, settings, producers=1),
        "raw-insert-16-pool": lambda: raw_pooled_case(url, settings, producers=n),
        "enqueue-1": lambda: queue_case(url, settings, producers=1, batch=1),
        "enqueue-1-own-connection": lambda: queue_case(
            url, settings, producers=1, batch=1, own_connections=True
        ),
        "enqueue-16": lambda: queue_case(url, settings, producers=n, batch=1),
        "raw-multirow": lambda: raw_case(url, settings, producers=1, copy=False, batch=batch),
        "raw-copy": lambda: raw_case(url, settings, producers=1, copy=True, batch=batch),
        "enqueue-many": lambda: queue_case(url, settings, producers=1, batch=batch),
        "http-jobs": lambda: http_case(url, settings, tools, batch=1),
        "http-batch": lambda: http_case(url, settings, tools, batch=settings.http_batch_size),
        "pgqueuer-single": lambda: peer_case(url, settings, tools, peer="pgqueuer", batch=1),
        "pgqueuer-batch": lambda: peer_case(url, settings, tools, peer="pgqueuer", batch=batch),
        "procrastinate-single": lambda: peer_case(
            url, settings, tools, peer="procrastinate", batch=1
        ),
        "procrastinate-batch": lambda: peer_case(
            url, settings, tools, peer="procrastinate", batch=batch
        ),
    }
    run = runners[name]()
    # A shared machine's other work shows here: a run is only as quiet as this says.
    return {"case": name, **run, "load_average_1m": round(os.getloadavg()[0], 2)}


# -- what can run here --------------------------------------------------------------


def skip_reasons(cases: Sequence[str], tools: Tools) -> dict[str, str]:
    """Why each case that cannot run here will not."""
    reasons = {}
    for case in CASES:
        if case.name not in cases:
            continue
        if case.needs == "wrk" and tools.wrk is None:
            reasons[case.name] = (
                "wrk is not installed (apt-get install wrk; python3 -m nox -s enqueue installs it)"
            )
        elif case.needs in PEERS and case.needs not in tools.peer_pythons:
            reasons[case.name] = (
                f"no --peer {case.needs}=PYTHON given (python3 -m nox -s enqueue builds "
                "the peers' virtualenvs and passes them)"
            )
    return reasons


# -- the command ----------------------------------------------------------------------


@click.command("enqueue")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Measured time per case and run (wrk rounds to whole seconds).",
)
@click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Warm-up per case and run, not measured (at least one call per producer).",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--quick", is_flag=True, help="1 s per case after 0.2 s of warm-up, one run.")
@click.option(
    "--connections",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Concurrent producers: connections, threads, wrk connections.",
)
@click.option("--batch-size", type=click.IntRange(1), default=1000, show_default=True)
@click.option(
    "--http-batch-size",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="Jobs per POST /jobs/batch request.",
)
@click.option(
    "--api-workers", type=click.IntRange(1), default=2, show_default=True, help="API processes."
)
@click.option(
    "--case",
    "cases",
    type=click.Choice(CASE_NAMES),
    multiple=True,
    help="Measure only this case (repeatable). Default: all.",
)
@click.option(
    "--peer",
    "peers",
    multiple=True,
    metavar="NAME=PYTHON",
    help="The Python of a peer's virtualenv (pgqueuer, procrastinate); repeatable.",
)
@database_url_option
@results_dir_option
@click.option(
    "--results-name",
    default="enqueue",
    show_default=True,
    help="The results file is <results dir>/<name>.json.",
)
def enqueue_command(
    seconds: float,
    warmup: float,
    repeats: int,
    quick: bool,
    connections: int,
    batch_size: int,
    http_batch_size: int,
    api_workers: int,
    cases: tuple[str, ...],
    peers: tuple[str, ...],
    database_url: str | None,
    results_dir: str | None,
    results_name: str,
) -> None:
    """Jobs per second into the queue (one at a time, in batches, over HTTP), beside raw
    SQL and the peers, on one server in one run."""
    if quick:
        seconds, warmup, repeats = min(seconds, 1.0), min(warmup, 0.2), 1
    settings = Settings(
        seconds=seconds,
        warmup=warmup,
        connections=connections,
        batch_size=batch_size,
        http_batch_size=http_batch_size,
        api_workers=api_workers,
    )
    tools = Tools(wrk=shutil.which("wrk"), peer_pythons=peer_pythons(peers))
    # Asked first: a peer's environment that cannot even say its version fails here,
    # before minutes of measuring.
    versions = {"wrk": wrk_version(tools.wrk), **peer_versions(tools)}
    chosen = [name for name in CASE_NAMES if not cases or name in cases]
    skipped = skip_reasons(chosen, tools)
    for name, reason in skipped.items():
        click.echo(f"skipping {name}: {reason}")
    measured = [name for name in chosen if name not in skipped]
    target = database.resolve_target(database_url)
    if tools.peer_pythons and not target.url.startswith(("postgresql://", "postgres://")):
        # The peers' own clients (asyncpg among them) take only URLs.
        raise click.BadParameter(
            "with --peer, give the database as a postgresql:// URL", param_hint="--database-url"
        )
    runs: list[dict[str, Any]] = []
    with LiveLine() as progress:
        for repeat in range(repeats):
            for name in measured:
                progress.update(f"enqueue: {name}, run {repeat + 1}/{repeats}", force=True)
                try:
                    run = run_case(name, target.url, settings, tools)
                except Exception as exc:  # one broken case must not hide the others' figures
                    run = {"case": name, "verified": False, "error": f"{type(exc).__name__}: {exc}",
                           "problems": [str(exc)]}  # fmt: skip
                runs.append({"repeat": repeat + 1, **run})
                progress.log(describe_run(run))
    summary = summarize(runs, skipped)
    for ratio in summary["ratios"]:
        click.echo(describe_ratio(ratio))
    for bound in summary["bounds"]:
        click.echo(describe_bound(bound))
    parameters = {
        **asdict(settings),
        "repeats": repeats,
        "cases": {case.name: case.label(settings) for case in CASES if case.name in chosen},
        "rate": "jobs / client wall-clock seconds, from all producers warmed up to the last "
        "call's return; HTTP: answered requests over wrk's own duration",
        "load_generator": "wrk, 1 thread, keep-alive connections, same machine",
        "plain_table": "CREATE TABLE plain_jobs (LIKE active_jobs INCLUDING ALL): no trigger",
    }
    document = results.document(
        "enqueue",
        environment=environment.describe(target.url, target.server, "pgqueue-api", **versions),
        parameters=parameters,
        runs=runs,
        summary=summary,
    )
    path = results.write(results_name, document, results_dir)
    click.echo(f"wrote {path}")
    if any(not run["verified"] for run in runs):
        raise click.ClickException("some runs were not verified: see above")
