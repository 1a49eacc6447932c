"""The unserved-backlog driver: what a backlog of jobs no worker serves costs the claims
and the next-run check of a worker that serves other tasks of the same queue.

For each backlog size (default 0 and 500,000), in one run, on a fresh schema each:
``size`` jobs of task ``typo`` are enqueued first, so that they come first in claim
order, then ``served`` jobs of task ``noop``, and the table is vacuumed and analyzed.
Then, as a worker serving ``noop`` alone:

- the claim: ``claims`` claims of ``limit`` jobs (``WorkerProtocol.claim``), each
  timed on the client's clock, round trips included; and the claim statement once more
  under ``EXPLAIN (ANALYZE, BUFFERS)``, in a transaction rolled back: the pages (shared
  buffers hit or read) it touched;
- the next-run check a worker sends after a claim that came back short
  (``WorkerProtocol.next_run_in``): timed ``claims`` times, and its pages.

Pages depend on the data and on the plan, not on how busy the machine is: they are the
figure to compare. The times are each statement's median and 95th percentile.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import click
import psycopg
from psycopg import sql

from pgqueue import JobSpec, WorkerProtocol, queries
from pgqueue_bench import results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.scenarios.scale.statements import run_statement

SERVED_TASK = "noop"
UNSERVED_TASK = "typo"
QUEUE_NAME = "default"
# Enqueued in batches of this many (each a COPY): the backlog is set-up, not measured.
LOAD_BATCH = 50_000


def measure(url: str, unserved: int, *, served: int, claims: int, limit: int) -> dict[str, Any]:
    """One backlog size on a fresh schema: the claim's and the next-run check's pages
    and times (see the module's docstring)."""
    with database.run_queue(url, "bench_unserved") as (schema, queue):
        for batch in _batches(unserved, LOAD_BATCH):
            queue.enqueue_many(JobSpec(UNSERVED_TASK, queue=QUEUE_NAME) for _ in range(batch))
        queue.enqueue_many(JobSpec(SERVED_TASK, queue=QUEUE_NAME) for _ in range(served))
        run_statement(url, "active_jobs_vacuum", schema)
        protocol = WorkerProtocol(queue)
        claim_pages = _pages(url, schema, "job_claim", _claim_params(limit))
        next_run_pages = _pages(
            url, schema, "job_next_run_delay", {"queues": [QUEUE_NAME], "tasks": [SERVED_TASK]}
        )
        claimed: list[int] = []
        claim_ms = _timed(
            claims,
            lambda: claimed.append(len(protocol.claim([QUEUE_NAME], [SERVED_TASK], limit))),
        )
        next_run_ms = _timed(claims, lambda: protocol.next_run_in([QUEUE_NAME], [SERVED_TASK]))
    if sum(claimed) != claims * limit:
        raise click.ClickException(
            f"the claims took {sum(claimed)} jobs, not {claims * limit}: too few served jobs"
        )
    return {
        "unserved_jobs": unserved,
        "served_jobs": served,
        "claim": {"pages": claim_pages, **_times(claim_ms)},
        "next_run": {"pages": next_run_pages, **_times(next_run_ms)},
    }


def _batches(total: int, size: int) -> Iterator[int]:
    while total > 0:
        yield min(total, size)
        total -= size


def _claim_params(limit: int) -> dict[str, Any]:
    return {
        "queues": [QUEUE_NAME],
        "tasks": [SERVED_TASK],
        "limit": limit,
        "lease_seconds": 30,
        "worker_id": "bench",
        "waiter": None,
        "waiter_seconds": None,
    }


def _pages(url: str, schema: str, name: str, params: dict[str, Any]) -> int:
    """Shared buffers the statement called ``name`` touched, run once for real under
    EXPLAIN (ANALYZE, BUFFERS) in a transaction that is rolled back, as the claim runs:
    after job_claim_plan."""
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + queries.bind(name, schema)
    with psycopg.connect(url, connect_timeout=10) as conn, conn.transaction(force_rollback=True):
        conn.execute(queries.bind("job_claim_plan", schema))
        row = conn.execute(explain, params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


def _timed(calls: int, call: Callable[[], object]) -> list[float]:
    """Milliseconds each of ``calls`` calls of ``call`` took."""
    spent = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        spent.append((time.perf_counter() - start) * 1000)
    return spent


def _times(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "ms_median": round(statistics.median(ordered), 3),
        "ms_p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
    }


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of job counts like 0,500000") from None
    if not sizes or any(size < 0 for size in sizes):
        raise click.BadParameter("job counts are zero or more, like 0,500000")
    return sizes


@click.command("unserved")
@click.option(
    "--sizes",
    default="0,500000",
    show_default=True,
    help="Queued jobs of a task no worker serves, per measurement (comma-separated).",
)
@click.option("--served", type=click.IntRange(1), default=2000, show_default=True)
@click.option(
    "--claims", type=click.IntRange(1), default=100, show_default=True, help="Calls timed."
)
@click.option(
    "--limit", type=click.IntRange(1), default=10, show_default=True, help="Jobs per claim."
)
@database_url_option
@results_dir_option
@click.option(
    "--results-name",
    default="unserved",
    show_default=True,
    help="The results file is <results dir>/<name>.json.",
)
def unserved_command(
    sizes: str,
    served: int,
    claims: int,
    limit: int,
    database_url: str | None,
    results_dir: str | None,
    results_name: str,
) -> None:
    """Pages and time of a claim and of the next-run check, by the backlog of a task the
    worker does not serve."""
    counts = _sizes(sizes)
    if claims * limit > served:
        raise click.BadParameter(
            f"{claims} claims of {limit} need at least {claims * limit} served jobs",
            param_hint="--served",
        )
    target = database.resolve_target(database_url)
    env = environment.describe(target.url, target.server)
    runs = []
    for count in counts:
        run = measure(target.url, count, served=served, claims=claims, limit=limit)
        click.echo(
            f"{count:>9} unserved: claim {run['claim']['pages']} pages, "
            f"{run['claim']['ms_median']} ms; next run {run['next_run']['pages']} pages, "
            f"{run['next_run']['ms_median']} ms"
        )
        runs.append(run)
    summary = {
        part: {
            str(run["unserved_jobs"]): {"pages": run[part]["pages"], "ms": run[part]["ms_median"]}
            for run in runs
        }
        for part in ("claim", "next_run")
    }
    results.record(
        results_name,
        env,
        parameters={
            "sizes": counts,
            "served": served,
            "claims": claims,
            "limit": limit,
            "queue": QUEUE_NAME,
            "served_task": SERVED_TASK,
            "unserved_task": UNSERVED_TASK,
            "pages": "shared buffers hit + read, EXPLAIN (ANALYZE, BUFFERS), one run",
            "ms": "client clock, round trip included; median and p95 of the calls",
        },
        runs=runs,
        summary=summary,
        directory=results_dir,
        benchmark="unserved",
    )
