"""The scale driver: does a job cost the same with months of history kept?

Three measurements, written to ``results/scale.json`` with a chart in
``results/scale.png`` and ``results/scale-soak.png``.

**History sizes.** A ``history`` schema is filled, step by step, with 0, 100k, 1M and
5M finished jobs (succeeded, dead and cancelled, as a month of traffic leaves them),
loaded with COPY into ``finished_jobs``, each job into its state's partition for the
UTC day it finished (the days are created first, as pgqueue's pruner creates them),
added to the queue counters as the finishing statements would have, and then frozen by
VACUUM as autovacuum would long since have done. The history spans the 30 whole days
before the day of the first load and that day up to the load. At each size the driver
measures, on that schema and on a ``baseline`` schema that holds no history:

- claim+ack throughput: ``--jobs`` no-op jobs are enqueued, then ``--clients``
  processes claim ``--batch`` jobs per statement and ack them (``WorkerProtocol.claim`` then
  ``WorkerProtocol.ack_many``, two transactions) until none is left; the rate is the jobs over
  the time from the first claim to the last ack;
- claim latency: every ``WorkerProtocol.claim`` call, timed in the client (round trip included);
- ``/metrics`` scrape time: GETs to the real API app (``pgqueue_api.app.create_app``)
  served by uvicorn on loopback, and the time of ``Queue.stats()`` (``pgqueue status``);
- table, partition and index sizes, from the catalogs: ``active_jobs`` (the hot table
  that claims, acks and heartbeats touch) apart from ``finished_jobs``;
- server CPU per job: the CPU seconds the private cluster's processes used during the
  run over the jobs, which other programs on the machine barely move;
- where the new jobs were written: how many heap pages of ``active_jobs`` hold them.

The two schemas are measured back to back within each repeat, so a machine that gets
busier slows both alike; the target (at least 95% of the throughput without history)
is judged on the median over repeats of the history run's throughput over the
baseline's at the largest size (also given: over the history schema's own empty-table
figure, measured earlier).

**Pruning a day.** With the largest history loaded, the real retention path,
``Queue.prune_expired``, runs with a retention under which exactly the oldest day of
history has expired: it drops that day's partitions. The driver reports the jobs that
went, the time it took, and ``active_jobs``' dead tuples, deletes and updates before
and after, which pruning must not raise (the target), and checks that the queue
counters fell by the jobs removed.

**Soak.** A producer keeps a backlog of no-op jobs while ``--clients`` processes claim
and ack as fast as they can for ``--soak-seconds``. In the middle half of the run a
REPEATABLE READ transaction that holds an xid stays open and holds back the xmin horizon,
as a forgotten ``BEGIN``, a long report or a long backup would: no row version that
dies meanwhile can be removed. The driver reports throughput, claim latency, dead
tuples of ``active_jobs`` and the claim index's size per window, and per phase
(before, during, after).

By default everything runs on a private cluster of the same PostgreSQL version as
``DATABASE_URL`` (or the embedded one), at PostgreSQL's default settings, so loading
gigabytes of history never touches a shared server; ``--database-url`` runs on a given
server instead.

The driver's parts, one job each: :mod:`~pgqueue_bench.scenarios.scale.scenario` (the queues,
sizes, server settings and targets), :mod:`~pgqueue_bench.scenarios.scale.statements`
(``scale.sql``, through the benchmarks' one loader), :mod:`~pgqueue_bench.scenarios.scale.history`
(the history and the catalogs' sizes and statistics), :mod:`~pgqueue_bench.scenarios.scale.clients`
(the claiming processes), :mod:`~pgqueue_bench.infra.server_cpu` (the server's CPU clock),
:mod:`~pgqueue_bench.scenarios.scale.measure`
(a drain, the scrapes and the prune on one schema), :mod:`~pgqueue_bench.scenarios.scale.soak`,
:mod:`~pgqueue_bench.scenarios.scale.summary` and :mod:`~pgqueue_bench.charts.scale`. This module
runs the history sizes and holds the command.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import asdict
from typing import Any

import click

from pgqueue import migrate
from pgqueue_bench import results
from pgqueue_bench.charts.scale import plot_scale
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.binaries import binaries_for
from pgqueue_bench.infra.server_cpu import ServerCpu, postgres_cpu_seconds
from pgqueue_bench.infra.servers import PrivateServer
from pgqueue_bench.options import results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.scale.history import HistoryWindow, load_history, relation_sizes
from pgqueue_bench.scenarios.scale.measure import measure_drain, measure_prune, measure_scrapes
from pgqueue_bench.scenarios.scale.scenario import (
    HISTORY_DAYS,
    METRICS_BUDGET_MS,
    PRIVATE_SERVER_SETTINGS,
    QUEUE_NAME,
    QUICK_SIZES,
    SIZES,
    THROUGHPUT_TOLERANCE,
    Scenario,
)
from pgqueue_bench.scenarios.scale.soak import run_soak
from pgqueue_bench.scenarios.scale.summary import summarize_sizes

# -- the history sizes ------------------------------------------------------------------


def run_sizes(
    url: str, scenario: Scenario, progress: LiveLine, server_cpu: ServerCpu | None = None
) -> dict[str, Any]:
    """Measure both schemas at every history size; the history schema grows by COPY."""
    runs: list[dict[str, Any]] = []
    sizes: list[dict[str, Any]] = []
    tag = uuid.uuid4().hex[:8]
    history = f"scale_history_{tag}"
    baseline = f"scale_baseline_{tag}"
    migrate(url, history)
    migrate(url, baseline)
    loaded = 0
    window = HistoryWindow.ending(database.database_now(url).timestamp(), max(scenario.sizes))
    prune: dict[str, Any] | None = None
    try:
        for size in sorted(set(scenario.sizes)):
            load = None
            if size > loaded:
                load = load_history(
                    url, history, loaded, size - loaded, window=window, progress=progress
                )
                loaded = size
                progress.log(
                    f"history {size:,}: loaded {load['rows']:,} rows at "
                    f"{load['rows_per_second']:,.0f}/s, frozen in {load['vacuum_freeze_seconds']:.0f} s"
                )
            for repeat in range(scenario.repeats):
                # Alternate which schema goes first, so neither always gets the warmer cache.
                order = [history, baseline] if repeat % 2 == 0 else [baseline, history]
                for schema in order:
                    role = "history" if schema == history else "baseline"
                    progress.update(
                        f"history {size:,}: {role} run {repeat + 1}/{scenario.repeats}", force=True
                    )
                    run = measure_drain(url, schema, scenario, server_cpu)
                    runs.append({"history_rows": size, "schema": role, "repeat": repeat + 1, **run})
                    progress.log(
                        f"history {size:,} {role}: {run['jobs_per_second']:,.0f} jobs/s, claim p99 "
                        f"{run['claim_latency_ms'].get('p99', float('nan')):.1f} ms, jobs on "
                        f"{run['heap_pages_of_measured_jobs']:,} pages"
                    )
            scrapes = {
                role: measure_scrapes(url, schema, scenario.scrapes)
                for role, schema in (("history", history), ("baseline", baseline))
            }
            progress.log(
                f"history {size:,}: /metrics p50 {scrapes['history']['metrics_ms']['p50']:.1f} ms, "
                f"p99 {scrapes['history']['metrics_ms']['p99']:.1f} ms"
            )
            sizes.append(
                {
                    "history_rows": size,
                    "load": load,
                    "storage": relation_sizes(url, history),
                    "baseline_storage": relation_sizes(url, baseline),
                    "scrapes": scrapes,
                }
            )
        if loaded:
            progress.update(f"history {loaded:,}: pruning the oldest day", force=True)
            prune = measure_prune(url, history, window, loaded)
            progress.log(
                f"history {loaded:,}: pruned {prune['day']} ({prune['jobs_removed'] or 0:,} jobs) "
                f"in {prune['seconds'] * 1000:,.0f} ms; active_jobs dead tuples "
                f"{prune['active_jobs_before'].get('n_dead_tup')} -> "
                f"{prune['active_jobs_after'].get('n_dead_tup')}"
            )
    finally:
        database.drop_schema(url, history)
        database.drop_schema(url, baseline)
    return {"runs": runs, "sizes": sizes, "prune": prune}


# -- the command ------------------------------------------------------------------------


def private_target(
    like_url: str | None, extra_settings: dict[str, str]
) -> tuple[database.Target, PrivateServer]:
    """A private cluster for the running command (scale, or ui, which loads the same
    history), destroyed when the command ends."""
    chosen = {**PRIVATE_SERVER_SETTINGS, **extra_settings}
    server = PrivateServer(binaries_for(like_url), settings=chosen)
    server.create()
    click.get_current_context().call_on_close(server.destroy)
    server.start()
    settings = ", ".join(f"{name}={value}" for name, value in chosen.items())
    target = database.Target(server.url(), f"private cluster, {server.binaries.label}, {settings}")
    return target, server


def _setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise click.BadParameter(f"{text!r} is not NAME=VALUE")
    return name.strip(), value.strip()


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of row counts") from None
    if not values or any(v < 0 for v in values):
        raise click.BadParameter("sizes must be non-negative row counts")
    return values


@click.command("scale")
@click.option(
    "--sizes",
    default=",".join(map(str, SIZES)),
    show_default=True,
    help="Finished jobs of history to measure at, comma-separated.",
)
@click.option(
    "--jobs",
    type=click.IntRange(100),
    default=20_000,
    show_default=True,
    help="Jobs claimed and acked per run.",
)
@click.option(
    "--clients", type=click.IntRange(1), default=2, show_default=True, help="Claiming processes."
)
@click.option(
    "--batch", type=click.IntRange(1), default=10, show_default=True, help="Jobs per claim."
)
@click.option("--repeats", type=click.IntRange(1), default=5, show_default=True)
@click.option(
    "--scrapes",
    type=click.IntRange(10),
    default=200,
    show_default=True,
    help="GET /metrics per size.",
)
@click.option(
    "--soak-seconds",
    type=click.FloatRange(0),
    default=600.0,
    show_default=True,
    help="0 skips the soak.",
)
@click.option("--quick", is_flag=True, help="Sizes 0 and 100k, 3000 jobs, one repeat, a 60 s soak.")
@click.option("--database-url", help="Run on this server instead of a private cluster.")
@click.option(
    "--server-setting",
    "server_settings",
    multiple=True,
    callback=lambda ctx, param, values: [_setting(value) for value in values],
    metavar="NAME=VALUE",
    help="A setting of the private cluster, e.g. shared_buffers=2GB (repeatable).",
)
@results_dir_option
@click.option("--results-name", default="scale", show_default=True)
def scale_command(
    sizes: str,
    jobs: int,
    clients: int,
    batch: int,
    repeats: int,
    scrapes: int,
    soak_seconds: float,
    quick: bool,
    database_url: str | None,
    server_settings: list[tuple[str, str]],
    results_dir: str | None,
    results_name: str,
) -> None:
    """Claim+ack throughput, claim latency, /metrics time and sizes with 0 to 5M
    finished jobs kept, pruning the oldest day of them, and a soak with the xmin
    horizon held back."""
    scenario = Scenario(
        sizes=QUICK_SIZES if quick else _sizes(sizes),
        jobs=min(jobs, 3000) if quick else jobs,
        clients=clients,
        batch=batch,
        repeats=1 if quick else repeats,
        scrapes=min(scrapes, 50) if quick else scrapes,
        soak_seconds=min(soak_seconds, 60.0) if quick else soak_seconds,
    )
    server_cpu: ServerCpu | None = None
    if database_url:
        target = database.Target(database_url, "given with --database-url")
    else:
        target, server = private_target(None, dict(server_settings))
        postmaster = server.postmaster_pid()
        if postmaster is not None:
            server_cpu = functools.partial(postgres_cpu_seconds, postmaster)
    summary: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    with LiveLine() as progress:
        measured = run_sizes(target.url, scenario, progress, server_cpu)
        runs = measured["runs"]
        details["sizes"] = measured["sizes"]
        summary["sizes"] = summarize_sizes(runs, measured["sizes"], measured["prune"])
        summary["prune"] = measured["prune"]
        if scenario.soak_seconds > 0:
            summary["soak"] = run_soak(target.url, scenario, progress)
    targets = summary["sizes"]["targets"]
    click.echo(
        f"throughput at {targets['largest_history_rows']:,} history rows: "
        f"{(targets['largest_ratio_to_baseline'] or 0):.1%} of the no-history baseline, "
        f"{(targets['largest_ratio_to_empty'] or 0):.1%} of the empty-table run "
        f"(target >= {1 - THROUGHPUT_TOLERANCE:.0%}: {'met' if targets['throughput_met'] else 'NOT met'})"
    )
    cpu_ratio = targets["largest_server_cpu_ratio_to_baseline"]
    if cpu_ratio is not None:
        click.echo(f"server CPU per job at that size: {cpu_ratio:.2f}x the no-history baseline")
    click.echo(
        f"/metrics worst p99 {targets['worst_metrics_p99_ms']:.1f} ms "
        f"(target < {METRICS_BUDGET_MS:g} ms: {'met' if targets['metrics_met'] else 'NOT met'})"
    )
    prune = summary["prune"]
    if prune is not None:
        click.echo(
            f"pruning the oldest day ({prune['day']}) of {prune['history_rows']:,} history rows: "
            f"{prune['jobs_removed'] or 0:,} jobs in {prune['seconds'] * 1000:,.0f} ms "
            f"({'checked' if prune['verified'] else 'NOT as counted before'}); active_jobs "
            f"dead tuples {prune['active_dead_tuples_added']:+,}, rows deleted or updated "
            f"{prune['active_rows_deleted_or_updated']:,} "
            f"(target: none: {'met' if prune['met'] else 'NOT met'})"
        )
    if "soak" in summary:
        for name, phase in summary["soak"]["phases"].items():
            rate = phase["mean_jobs_per_second"]
            click.echo(
                f"soak {name}: mean {rate or 0:,.0f} jobs/s, max dead tuples in active_jobs "
                f"{phase['max_dead_tuples']}"
            )
    parameters = {
        **asdict(scenario),
        "soak_window": scenario.soak_window,
        "queue": QUEUE_NAME,
        "history_mix": "94% succeeded, 4% dead, 2% cancelled; 70% in the measured queue",
        "history_days": f"finished evenly over the {HISTORY_DAYS} whole UTC days before the "
        "first load's day and that day up to the load, COPYed into finished_jobs' day "
        "partitions and added to queue_counters",
        "storage": "active_jobs holds queued and running jobs; finished_jobs (partitioned by "
        "state, then UTC day) the history; table bytes include TOAST",
        "prune": "Queue.prune_expired with a retention that expires the oldest day only, "
        "on the largest history; active_jobs statistics read once published",
        "dead_tuples": "n_dead_tup of active_jobs (pg_stat_user_tables)",
        "rate": "acked jobs / (last ack - first claim), per run, wall clock",
        "ratio_to_baseline": "median over repeats of history / baseline within the repeat",
        "server_cpu": "CPU seconds of the private cluster's processes during a run / jobs",
        "claim_latency": "one WorkerProtocol.claim call of up to `batch` jobs, timed in the client",
    }
    document = results.document(
        "scale",
        environment=environment.describe(target.url, target.server),
        parameters=parameters,
        runs=runs,
        summary=summary,
    )
    document["sizes"] = details["sizes"]
    path = results.write(results_name, document, results_dir)
    click.echo(f"wrote {path}")
    for chart in plot_scale(document, results.results_dir(results_dir)):
        click.echo(f"wrote {chart}")
