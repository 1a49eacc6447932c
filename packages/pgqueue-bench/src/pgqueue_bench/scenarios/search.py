"""The search driver: what ``GET /jobs?tag=`` and ``?payload_contains=`` cost over a large
backlog, and over finished history, which has no index for them.

On a fresh schema, ``--active`` queued jobs (default 1,000,000) are written straight
into active_jobs (each with a payload ``{"customer", "order", "kind"}`` and two tags),
then the two GIN indexes are built, each build timed, and ``--finished`` succeeded jobs
(default 1,000,000) into today's history. Then each search is run ``--calls`` times
through ``Queue.list`` (a page of 50, as the API asks for), on the client's clock,
round trips included:

- over the queued and running jobs (``state=queued``): a tag that 1,000 jobs carry,
  two tags that 334 carry together, a tag no job carries, a payload customer that 10
  jobs have, and a customer and kind that match none;
- over every job, history included (no state): a tag 1,000 finished jobs carry (the
  page fills from the newest history), and a payload customer that 10 finished jobs
  have, which reads the whole history to fill its page.

Each search's median and 95th percentile, and the jobs it returned.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import click
import psycopg

from pgqueue import Queue
from pgqueue_bench import results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.sql.queries import schema_statement_in

STATEMENTS = "search.sql"
ACTIVE_SEARCHES: dict[str, dict[str, Any]] = {
    "tag (1,000 jobs)": {"tags": ["c7"]},
    "two tags (334 jobs)": {"tags": ["c7", "eu"]},
    "tag of no job": {"tags": ["nowhere"]},
    "payload customer (10 jobs)": {"payload_contains": {"customer": 4242}},
    "payload customer and kind (none)": {"payload_contains": {"customer": 4242, "kind": "x"}},
}
HISTORY_SEARCHES: dict[str, dict[str, Any]] = {
    "tag (1,000 finished jobs)": {"tags": ["h7"]},
    "payload customer (10 finished jobs)": {"payload_contains": {"customer": 104242}},
}


def _run(url: str, schema: str, name: str, params: dict[str, Any] | None = None) -> float:
    """Run the set-up statement ``name``; the seconds it took."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        started = time.perf_counter()
        conn.execute(schema_statement_in(STATEMENTS, name, schema), params)
        return time.perf_counter() - started


def _timed(queue: Queue, calls: int, state: str | None, search: dict[str, Any]) -> dict[str, Any]:
    spent, found = [], 0
    for _ in range(calls):
        started = time.perf_counter()
        page = queue.list(state=state, limit=50, **search)
        spent.append((time.perf_counter() - started) * 1000)
        found = len(page.jobs)
    ordered = sorted(spent)
    return {
        "jobs_returned": found,
        "ms_median": round(statistics.median(ordered), 3),
        "ms_p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
    }


@click.command("search")
@click.option(
    "--active",
    type=click.IntRange(1000),
    default=1_000_000,
    show_default=True,
    help="Queued jobs to search.",
)
@click.option(
    "--finished",
    type=click.IntRange(1000),
    default=1_000_000,
    show_default=True,
    help="Finished jobs in history.",
)
@click.option(
    "--calls",
    type=click.IntRange(1),
    default=20,
    show_default=True,
    help="Times each search is run.",
)
@database_url_option
@results_dir_option
@click.option(
    "--results-name",
    default="search",
    show_default=True,
    help="The results file is <results dir>/<name>.json.",
)
def search_command(
    active: int,
    finished: int,
    calls: int,
    database_url: str | None,
    results_dir: str | None,
    results_name: str,
) -> None:
    """Time tag and payload searches over a large backlog, and over finished history."""
    target = database.resolve_target(database_url)
    env = environment.describe(target.url, target.server)
    with database.run_queue(target.url, "bench_search") as (schema, queue):
        _run(target.url, schema, "search_indexes_drop")
        load = _run(target.url, schema, "search_active_load", {"count": active})
        tags_build = _run(target.url, schema, "search_tags_index_create")
        payload_build = _run(target.url, schema, "search_payload_index_create")
        _run(target.url, schema, "search_finished_load", {"count": finished})
        _run(target.url, schema, "search_vacuum")
        click.echo(
            f"{active} queued jobs loaded in {load:.1f} s; index builds: tags "
            f"{tags_build:.1f} s, payload {payload_build:.1f} s"
        )
        searches: dict[str, Any] = {}
        for name, search in ACTIVE_SEARCHES.items():
            searches[f"active: {name}"] = _timed(queue, calls, "queued", search)
        for name, search in HISTORY_SEARCHES.items():
            searches[f"all: {name}"] = _timed(queue, calls, None, search)
        for name, measured in searches.items():
            click.echo(
                f"{name:<48} {measured['ms_median']:>10.2f} ms ({measured['jobs_returned']} jobs)"
            )
    run = {
        "active_jobs": active,
        "finished_jobs": finished,
        "index_build_seconds": {
            "active_jobs_tags_idx": round(tags_build, 2),
            "active_jobs_payload_idx": round(payload_build, 2),
        },
        "searches": searches,
    }
    results.record(
        results_name,
        env,
        parameters={"active": active, "finished": finished, "calls": calls, "page": 50},
        directory=results_dir,
        runs=[run],
        summary={name: measured["ms_median"] for name, measured in searches.items()},
    )
