"""The dashboard driver: how long each ``/ui`` page and fragment takes with millions of
finished jobs kept.

A fresh schema gets ``--finished`` finished jobs (5M by default), loaded as ``pgqueue
bench scale`` loads its history
(:func:`pgqueue_bench.scenarios.scale.history.load_history`: COPY into the day
partitions, counted, frozen), but finishing at ``--finished-per-second`` up to now, so
that the last hour, which the queues page's chart reads, holds as many jobs as a queue
that busy leaves there. Then, as a live system has them: ``--queued`` queued jobs (a
third with a unique key), ``--running`` of them claimed by a worker, four workers in the
registry and five schedules; and a workflow of 100 jobs, for its page and the page of a
job with 98 dependencies.

A real ``pgqueue-api`` process (one worker process, no tokens) serves the schema. The
first ``GET /ui`` of the process is timed on its own: it reads the whole last hour of
finished jobs, which later loads do not (see ``pgqueue_api.ui.finished``). Then every
page and fragment is requested ``--requests`` times, one request at a time after one
untimed request, over one HTTP connection, and timed in the client (round trip
included). Results go to ``results/ui.json``.

By default everything runs on a private cluster of the same PostgreSQL version as
``DATABASE_URL`` (or the embedded one), at PostgreSQL's default settings, as ``pgqueue
bench scale`` does; ``--database-url`` runs on a given server instead.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import click
import httpx

from pgqueue import JobSpec, Queue, WorkerProtocol, WorkerRegistration
from pgqueue.schedules import Schedule
from pgqueue_bench import handlers, results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.apiserver import api_process
from pgqueue_bench.options import results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.latency import percentiles
from pgqueue_bench.scenarios.scale.driver import private_target
from pgqueue_bench.scenarios.scale.history import HistoryWindow, load_history
from pgqueue_bench.scenarios.scale.scenario import OTHER_QUEUES, QUEUE_NAME

BUDGET_MS = 100.0
"""Every page's p99 should stay under this with 5M finished jobs kept."""
QUEUES = (QUEUE_NAME, *OTHER_QUEUES)
TASKS = {QUEUE_NAME: handlers.NOOP_TASK, **{name: f"{name}_task" for name in OTHER_QUEUES}}
WORKERS = 4
SCHEDULES = 5
LEASE_SECONDS = 3600.0
"""The running jobs' lease: longer than any run, so none is reaped meanwhile."""
ENQUEUE_BATCH = 1000
WORKFLOW_JOBS = 100
"""A workflow's jobs: one, a fan-out of WORKFLOW_JOBS - 2 waiting for it, and one
waiting for all of those, for the workflow page and a job page with many links."""


@dataclass(frozen=True)
class UiScenario:
    """What one run loads and how often it asks for each page."""

    finished: int
    finished_per_second: float
    queued: int
    running: int
    requests: int


@dataclass(frozen=True)
class Loaded:
    """Ids and keys of the loaded jobs that the pages are asked about."""

    finished_id: int
    running_id: int
    unique_key: str
    workflow_root_id: int = 1
    """The first job of the workflow (see WORKFLOW_JOBS)."""
    fan_in_id: int = 1
    """Its last job, which depends on all the others but the first."""


@dataclass(frozen=True)
class Page:
    """One thing the dashboard serves: a name, its path, the status it answers and
    text it shows when it shows what was loaded."""

    name: str
    path: str
    status: int = 200
    shows: str = ""


def history_window(end: float, scenario: UiScenario) -> HistoryWindow:
    """The finished jobs end at ``end`` (Unix time), ``finished_per_second`` apart."""
    span = scenario.finished / scenario.finished_per_second
    return HistoryWindow(start=end - span, end=end, total=scenario.finished)


def load(
    url: str, schema: str, scenario: UiScenario, progress: LiveLine
) -> tuple[Loaded, dict[str, Any]]:
    """Fill ``schema``: the finished jobs, then the queued and running ones, workers and
    schedules, and a workflow (see WORKFLOW_JOBS). Returns what the pages ask about and the history load's timings."""
    window = history_window(database.database_now(url).timestamp(), scenario)
    history = load_history(url, schema, 0, scenario.finished, window=window, progress=progress)
    progress.update(f"queued and running jobs: {scenario.queued:,}", force=True)
    with Queue.connect(url, schema=schema, max_size=2) as queue:
        protocol = WorkerProtocol(queue)
        specs = []
        for n in range(scenario.queued):
            name = QUEUES[n % len(QUEUES)]
            key = f"account-{n}" if n % 3 == 0 else None
            specs.append(JobSpec(TASKS[name], {"n": n}, queue=name, unique_key=key))
        for start in range(0, len(specs), ENQUEUE_BATCH):
            queue.enqueue_many(specs[start : start + ENQUEUE_BATCH])
        running: list[int] = []
        while len(running) < scenario.running:
            claimed = protocol.claim(
                QUEUES,
                list(TASKS.values()),
                min(500, scenario.running - len(running)),
                lease_seconds=LEASE_SECONDS,
                worker_id=f"bench-host-0:1000:{len(running):08x}",
            )
            if not claimed:
                break
            running += [job.id for job in claimed]
        # Enqueued after the claims, so that none of its jobs is among the running.
        flow_queue = OTHER_QUEUES[1]
        flow_task = TASKS[flow_queue]
        root = queue.enqueue(flow_task, {"step": "extract"}, queue=flow_queue).job.id
        steps = queue.enqueue_many(
            [
                JobSpec(flow_task, {"part": n}, queue=flow_queue, depends_on=[root])
                for n in range(WORKFLOW_JOBS - 2)
            ]
        )
        fan_in = queue.enqueue(
            flow_task,
            {"step": "report"},
            queue=flow_queue,
            depends_on=[step.job.id for step in steps],
        ).job.id
        for n in range(WORKERS):
            queue.register_worker(
                WorkerRegistration(
                    id=f"bench-host-{n}:{1000 + n}:{n:08x}",
                    queues=list(QUEUES),
                    tasks=list(TASKS.values()),
                    concurrency=16,
                    expiry_seconds=LEASE_SECONDS,
                    host=f"bench-host-{n}",
                    pid=1000 + n,
                )
            )
        schedules = {
            f"report-{n}": Schedule(
                f"report-{n}", f"*/{n + 5} * * * *", TASKS[OTHER_QUEUES[1]], queue=OTHER_QUEUES[1]
            )
            for n in range(SCHEDULES)
        }
        queue.sync_schedules(schedules, [])
        held = queue.get_by_unique_key("account-0") if scenario.queued else None
    loaded = Loaded(
        finished_id=history["first_id"] + scenario.finished // 2,
        running_id=running[0] if running else history["first_id"],
        unique_key=held.unique_key if held and held.unique_key else "account-0",
        workflow_root_id=root,
        fan_in_id=fan_in,
    )
    return loaded, history


def pages(loaded: Loaded, next_after: int | None) -> list[Page]:
    """Every page and fragment of the dashboard, with filters and searches that read
    each kind of index (``next_after`` is the unfiltered first page's next page)."""
    finished, running = loaded.finished_id, loaded.running_id
    other = OTHER_QUEUES[0]
    found = [
        Page("/ui (queues)", "/ui"),
        Page("queues fragment", "/ui/fragments/queues"),
        Page("jobs", "/ui/jobs", shows='data-job="'),
        Page("jobs, next page", f"/ui/jobs?after={next_after or finished}"),
        Page("jobs, deep in history", f"/ui/jobs?after={finished}"),
        Page("jobs by queue", f"/ui/jobs?queue={QUEUE_NAME}"),
        Page("jobs by state succeeded", "/ui/jobs?state=succeeded", shows='data-job="'),
        Page("jobs by queue and state dead", f"/ui/jobs?queue={other}&state=dead"),
        Page("jobs by queue and state queued", f"/ui/jobs?queue={other}&state=queued"),
        Page("jobs by task", f"/ui/jobs?task={TASKS[other]}"),
        Page("jobs fragment", "/ui/fragments/jobs"),
        Page("jobs fragment, filtered", f"/ui/fragments/jobs?queue={QUEUE_NAME}&state=succeeded"),
        Page("find by id", f"/ui/jobs?q={finished}", 303),
        Page("find by unique key", f"/ui/jobs?q={loaded.unique_key}", 303),
        Page("find, nothing", "/ui/jobs?q=no-such-key", 200),
        Page("job, finished", f"/ui/jobs/{finished}", shows=f"Job {finished}"),
        Page("job, running", f"/ui/jobs/{running}", shows=f"Job {running}"),
        Page("job fragment", f"/ui/fragments/jobs/{running}"),
        Page(
            f"job, {WORKFLOW_JOBS - 2} dependencies",
            f"/ui/jobs/{loaded.fan_in_id}",
            shows=f"Depends on <small>{WORKFLOW_JOBS - 2}</small>",
        ),
        Page(
            f"job fragment, {WORKFLOW_JOBS - 2} dependencies",
            f"/ui/fragments/jobs/{loaded.fan_in_id}",
        ),
        Page(
            f"workflow, {WORKFLOW_JOBS} jobs",
            f"/ui/jobs/{loaded.workflow_root_id}/workflow",
            shows=f"{WORKFLOW_JOBS} jobs:",
        ),
        Page("workers", "/ui/workers", shows=f"bench-host-{WORKERS - 1}"),
        Page("workers fragment", "/ui/fragments/workers"),
        Page("schedules", "/ui/schedules", shows=f"report-{SCHEDULES - 1}"),
        Page("schedules fragment", "/ui/fragments/schedules"),
    ]
    return found


class PageError(click.ClickException):
    """A page answered something other than what it should."""


def _get(client: httpx.Client, page: Page) -> float:
    """One request for ``page``; its time in milliseconds."""
    began = time.perf_counter()
    answer = client.get(page.path)
    elapsed = (time.perf_counter() - began) * 1000
    if answer.status_code != page.status:
        raise PageError(
            f"{page.path} answered {answer.status_code}, not {page.status}: {answer.text[:300]}"
        )
    if page.shows not in answer.text:
        raise PageError(f"{page.path} does not show {page.shows!r}")
    return elapsed


def _next_after(client: httpx.Client) -> int | None:
    found = re.search(r'href="/ui/jobs\?after=(\d+)" rel="next"', client.get("/ui/jobs").text)
    return int(found[1]) if found else None


def measure(base: str, loaded: Loaded, requests: int, progress: LiveLine) -> dict[str, Any]:
    """Time the first ``/ui`` of a fresh API process, then every page ``requests``
    times; returns ``first_load_ms`` and each page's path and timings."""
    timings: dict[str, list[float]] = {}
    paths: dict[str, str] = {}
    # Other programs on the machine slow the pages down too: say how busy it was.
    load_before = os.getloadavg()
    with httpx.Client(base_url=base, timeout=60.0, follow_redirects=False) as client:
        # Warm the process's connection pool and templates on a page that does not
        # read the chart's hour, so that the first /ui pays for that read alone.
        next_after = _next_after(client)
        first_load_ms = _get(client, Page("/ui", "/ui"))
        for page in pages(loaded, next_after):
            progress.update(f"{page.name}: {requests} requests", force=True)
            _get(client, page)
            timings[page.name] = [_get(client, page) for _ in range(requests)]
            paths[page.name] = page.path
    return {
        "first_load_ms": first_load_ms,
        "timings": timings,
        "paths": paths,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }


def summarize(
    timings: Mapping[str, Iterable[float]], budget_ms: float = BUDGET_MS
) -> dict[str, Any]:
    """Per page p50, p99 and max (milliseconds) and the number of requests; the worst
    p99 and its page, and whether every p99 is under ``budget_ms``."""
    per_page = {}
    for name, values in timings.items():
        numbers = list(values)
        if not numbers:
            continue
        cut = percentiles(numbers)
        per_page[name] = {
            "requests": len(numbers),
            "p50_ms": round(cut["p50"], 2),
            "p99_ms": round(cut["p99"], 2),
            "max_ms": round(cut["max"], 2),
        }
    worst = max(per_page, key=lambda name: per_page[name]["p99_ms"], default=None)
    return {
        "pages": per_page,
        "worst_page": worst,
        "worst_p99_ms": per_page[worst]["p99_ms"] if worst else None,
        "budget_ms": budget_ms,
        "met": bool(per_page) and all(page["p99_ms"] < budget_ms for page in per_page.values()),
    }


def _last_hour(url: str, schema: str) -> dict[str, Any]:
    """What the chart's first load reads: ``Queue.finished_per_minute(60)``, timed."""
    with Queue.connect(url, schema=schema, max_size=1) as queue:
        began = time.perf_counter()
        rows = queue.finished_per_minute(60)
        elapsed = (time.perf_counter() - began) * 1000
    return {"jobs": sum(row.jobs for row in rows), "finished_per_minute_ms": round(elapsed, 1)}


@click.command("ui")
@click.option(
    "--finished",
    type=click.IntRange(0),
    default=5_000_000,
    show_default=True,
    help="Finished jobs kept.",
)
@click.option(
    "--finished-per-second",
    type=click.FloatRange(0.001),
    default=100.0,
    show_default=True,
    help="How fast they finished, up to now (sets how many the last hour holds).",
)
@click.option("--queued", type=click.IntRange(1), default=3000, show_default=True)
@click.option(
    "--running", type=click.IntRange(0), default=500, show_default=True, help="Of the queued."
)
@click.option(
    "--requests",
    type=click.IntRange(1),
    default=200,
    show_default=True,
    help="Timed requests per page.",
)
@click.option("--database-url", help="Run on this server instead of a private cluster.")
@results_dir_option
@click.option("--results-name", default="ui", show_default=True)
def ui_command(
    finished: int,
    finished_per_second: float,
    queued: int,
    running: int,
    requests: int,
    database_url: str | None,
    results_dir: str | None,
    results_name: str,
) -> None:
    """Time of every dashboard page and fragment with FINISHED finished jobs kept."""
    if running > queued:
        raise click.BadParameter("cannot be more than --queued", param_hint="--running")
    scenario = UiScenario(finished, finished_per_second, queued, running, requests)
    if database_url:
        target = database.Target(database_url, "given with --database-url")
    else:
        target, _ = private_target(None, {})
    with LiveLine() as progress, database.run_schema(target.url, "ui") as schema:
        loaded, history = load(target.url, schema, scenario, progress)
        progress.log(
            f"loaded {finished:,} finished jobs at {history['rows_per_second'] or 0:,.0f}/s, "
            f"{queued:,} queued of which {running:,} running"
        )
        last_hour = _last_hour(target.url, schema)
        with api_process(target.url, schema, workers=1) as port:
            measured = measure(f"http://127.0.0.1:{port}", loaded, requests, progress)
    summary = summarize(measured["timings"])
    summary["first_load"] = {"ui_ms": round(measured["first_load_ms"], 1), "last_hour": last_hour}
    for name, page in summary["pages"].items():
        click.echo(
            f"{name:<32} p50 {page['p50_ms']:7.1f} ms  p99 {page['p99_ms']:7.1f} ms  "
            f"max {page['max_ms']:7.1f} ms"
        )
    click.echo(
        f"first /ui of the process: {summary['first_load']['ui_ms']:,.0f} ms "
        f"(the last hour: {last_hour['jobs']:,} finished jobs)"
    )
    click.echo(
        f"worst p99 {summary['worst_p99_ms']} ms ({summary['worst_page']}; target < "
        f"{BUDGET_MS:g} ms: {'met' if summary['met'] else 'NOT met'})"
    )
    parameters = {
        **asdict(scenario),
        "queues": list(QUEUES),
        "history": "scale's history mix (94% succeeded, 4% dead, 2% cancelled; 70% in "
        f"{QUEUE_NAME!r}), finishing evenly up to the load at finished_per_second, COPYed "
        "into finished_jobs' day partitions, counted and frozen",
        "active": "queued jobs spread over the queues, every third with a unique key; "
        f"`running` of them claimed; {WORKERS} registered workers, {SCHEDULES} schedules; "
        f"a workflow of {WORKFLOW_JOBS} jobs in {OTHER_QUEUES[1]} (one, a fan-out of "
        f"{WORKFLOW_JOBS - 2} waiting for it, one waiting for them all)",
        "api": "one pgqueue-api process (--workers 1), no tokens, on loopback",
        "timing": "one request at a time over one HTTP connection, after one untimed "
        "request per page, timed in the client (round trip included); redirects not followed",
        "first_load": "the process's first GET /ui (after one GET /ui/jobs warms its pool "
        "and templates): it reads the whole last hour for the chart",
        "paths": measured["paths"],
    }
    document = results.document(
        "ui",
        environment=environment.describe(target.url, target.server, "pgqueue-api"),
        parameters=parameters,
        runs=[
            {
                "history": history,
                "loaded": asdict(loaded),
                "load_average_1_5_15_min": measured["load_average"],
            }
        ],
        summary=summary,
    )
    path = results.write(results_name, document, results_dir)
    click.echo(f"wrote {path}")
