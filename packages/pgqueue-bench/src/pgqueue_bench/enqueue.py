"""The enqueue driver: how fast jobs get in, beside what the same server takes from raw
SQL and from the peers, all in one run on one server.

Cases, each measured for ``--seconds`` after a warm-up of ``--warmup`` seconds (every
producer makes at least one call in it), each on a fresh schema, or for the peers a
fresh database:

- raw SQL into ``plain_jobs``, a table created ``LIKE`` active_jobs (its columns,
  defaults, constraints and indexes, no triggers), on autocommit connections:
  one prepared ``INSERT ... RETURNING id`` per transaction on one connection
  (``raw-insert-1``) and on ``--connections`` connections (16 unless told), a thread
  each (``raw-insert-16``); ``--batch-size`` rows per statement from arrays
  (``raw-multirow``) and per ``COPY`` (``raw-copy``);
- pgqueue: ``Queue.enqueue`` on a pool of one connection (``enqueue-1``) and from
  ``--connections`` threads on a pool as large (``enqueue-16``); ``Queue.enqueue_many``
  of ``--batch-size`` jobs per call (``enqueue-many``);
- its HTTP API, ``pgqueue-api --workers 2``, driven by ``wrk`` (one thread,
  ``--connections`` keep-alive connections; a C load generator, so the client costs
  the server's machine little): ``POST /jobs`` (``http-jobs``) and ``POST /jobs/batch``
  of ``--http-batch-size`` jobs (``http-batch``);
- the peers, each from its own virtualenv (``--peer NAME=PYTHON``, as ``nox -s enqueue``
  passes): PgQueuer's ``Queries.enqueue`` and procrastinate's ``defer_async``, one job
  per call and ``--batch-size`` per call (``bench/peers/enqueue_*.py``).

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
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pgqueue import JobSpec, Queue
from pgqueue_bench import apiserver, database, environment, handlers, results
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.queries import statement_in

QUEUE_NAME = "bench_enqueue"
TASK = handlers.NOOP_TASK
SCHEMA_PREFIX = "bench_enqueue"
STATEMENTS = "enqueue.sql"
PEERS = ("pgqueuer", "procrastinate")
# Where each peer keeps a job it has not run yet: the rows to count.
PEER_TABLES = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate_jobs"}
DEFAULT_PEERS_DIR = Path("bench/peers")
WRK_MARKER = "wrk-json "
# On top of a case's own time: connecting, starting the API, a peer's interpreter.
CASE_OVERHEAD_TIMEOUT = 180.0


@dataclass(frozen=True)
class Settings:
    """One enqueue run's shape."""

    seconds: float = 5.0
    warmup: float = 1.0
    connections: int = 16
    batch_size: int = 1000
    http_batch_size: int = 100
    api_workers: int = 2

    @property
    def wrk_seconds(self) -> int:
        """wrk takes whole seconds."""
        return max(1, round(self.seconds))

    @property
    def wrk_warmup_seconds(self) -> int:
        return max(1, round(self.warmup))


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
    Case("enqueue-1", "", lambda s: "`Queue.enqueue`, one job per call, 1 connection"),
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

# The comparisons the producer path is held to: (numerator, denominator, at least).
RATIOS = (
    ("enqueue-1", "raw-insert-1", 0.9),
    ("enqueue-1", "pgqueuer-single", 1.5),
    ("enqueue-16", "raw-insert-16", 0.8),
    ("enqueue-many", "raw-multirow", 0.8),
    ("enqueue-many", "pgqueuer-batch", 1.2),
)
# Figures held to a bound of their own: (case, figure, "min" or "max", bound). The
# POST /jobs bound is three times the 801 requests/s the API served on this machine
# while every enqueue still took the database-wide notification lock.
BOUNDS = (
    ("http-jobs", "requests_per_second", "min", 2403.0),
    ("http-jobs", "latency_p99_ms", "max", 50.0),
    ("http-batch", "jobs_per_second", "min", 40000.0),
)


# -- producers in threads -------------------------------------------------------------


@dataclass
class Timing:
    """What a timed run of producers counted."""

    jobs: int
    calls: int
    seconds: float
    warmup_jobs: int


@dataclass
class _Tally:
    warmup_jobs: int = 0
    jobs: int = 0
    calls: int = 0
    finished_at: float = 0.0
    failure: BaseException | None = None


def run_producers(producers: Sequence[Callable[[], int]], seconds: float, warmup: float) -> Timing:
    """Call each producer over and over, each in a thread of its own: during ``warmup``
    (at least once each), then, from the moment all have warmed up, for ``seconds``.
    A call returns how many jobs it added. The first producer failure is raised."""
    tallies = [_Tally() for _ in producers]
    window: dict[str, float] = {}

    def open_window() -> None:  # run once, by the last producer to warm up
        window["start"] = time.perf_counter()
        window["stop"] = window["start"] + seconds

    warmed_up = threading.Barrier(len(producers), action=open_window)
    warm_until = time.perf_counter() + warmup

    def produce(produce_once: Callable[[], int], tally: _Tally) -> None:
        try:
            tally.warmup_jobs += produce_once()
            while time.perf_counter() < warm_until:
                tally.warmup_jobs += produce_once()
            warmed_up.wait()
            while time.perf_counter() < window["stop"]:
                tally.jobs += produce_once()
                tally.calls += 1
        except threading.BrokenBarrierError:
            pass  # another producer failed: its failure is the one to report
        except BaseException as exc:
            tally.failure = exc
            warmed_up.abort()
        finally:
            tally.finished_at = time.perf_counter()

    threads = [
        threading.Thread(target=produce, args=pair, name=f"producer-{n}", daemon=True)
        for n, pair in enumerate(zip(producers, tallies, strict=True))
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + warmup + seconds + CASE_OVERHEAD_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise TimeoutError(f"{thread.name} still busy long after its time was up")
    for tally in tallies:
        if tally.failure is not None:
            raise tally.failure
    return Timing(
        jobs=sum(t.jobs for t in tallies),
        calls=sum(t.calls for t in tallies),
        seconds=max(t.finished_at for t in tallies) - window["start"],
        warmup_jobs=sum(t.warmup_jobs for t in tallies),
    )


def _payloads(numbers: Iterator[int], count: int) -> list[dict[str, int]]:
    return [{"seq": next(numbers)} for _ in range(count)]


def _raw_insert(conn: psycopg.Connection, schema: str, batch: int) -> Callable[[], int]:
    """One prepared statement per call: one row, or ``batch`` rows from arrays."""
    if batch == 1:
        one = statement_in(STATEMENTS, "plain_insert_one", schema=sql.Identifier(schema))
        numbers = itertools.count()

        def insert_one() -> int:
            params = {"queue": QUEUE_NAME, "task": TASK, "payload": Jsonb({"seq": next(numbers)})}
            conn.execute(one, params, prepare=True).fetchone()
            return 1

        return insert_one
    many = statement_in(STATEMENTS, "plain_insert_many", schema=sql.Identifier(schema))
    numbers = itertools.count()

    def insert_many() -> int:
        params = {
            "queue": [QUEUE_NAME] * batch,
            "task": [TASK] * batch,
            "payload": [Jsonb(payload) for payload in _payloads(numbers, batch)],
        }
        conn.execute(many, params, prepare=True).fetchall()
        return batch

    return insert_many


def _raw_copy(conn: psycopg.Connection, schema: str, batch: int) -> Callable[[], int]:
    """One ``COPY`` of ``batch`` rows per call, each its own transaction."""
    copy_in = statement_in(STATEMENTS, "plain_copy", schema=sql.Identifier(schema))
    numbers = itertools.count()

    def copy_rows() -> int:
        with conn.cursor() as cur, cur.copy(copy_in) as copy:
            for payload in _payloads(numbers, batch):
                copy.write_row((QUEUE_NAME, TASK, json.dumps(payload)))
        return batch

    return copy_rows


def _queue_enqueue(queue: Queue, batch: int) -> Callable[[], int]:
    """``Queue.enqueue`` of one job per call, or ``enqueue_many`` of ``batch``."""
    numbers = itertools.count()
    if batch == 1:

        def enqueue_one() -> int:
            queue.enqueue(TASK, {"seq": next(numbers)}, queue=QUEUE_NAME)
            return 1

        return enqueue_one

    def enqueue_many() -> int:
        specs = [JobSpec(TASK, payload, queue=QUEUE_NAME) for payload in _payloads(numbers, batch)]
        queue.enqueue_many(specs)
        return batch

    return enqueue_many


# -- verification -----------------------------------------------------------------------


def count_rows(url: str, table: sql.Identifier) -> int:
    """Rows in ``table`` now."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        query = statement_in(STATEMENTS, "rows_count", table=table)
        return conn.execute(query).fetchone()[0]


def outcome(timing: Timing, stored: int, *, extra_allowed: int = 0) -> dict[str, Any]:
    """A run's figures, verified: the table holds the jobs counted (warm-up included),
    or at most ``extra_allowed`` more (sent but unanswered when the load stopped)."""
    counted = timing.warmup_jobs + timing.jobs
    problems = []
    if not counted <= stored <= counted + extra_allowed:
        allowance = f" (+{extra_allowed} in flight)" if extra_allowed else ""
        problems.append(f"counted {counted}{allowance} jobs, the table holds {stored}")
    return {
        "jobs": timing.jobs,
        "calls": timing.calls,
        "seconds": round(timing.seconds, 3),
        "jobs_per_second": timing.jobs / timing.seconds if timing.seconds > 0 else None,
        "warmup_jobs": timing.warmup_jobs,
        "rows_stored": stored,
        "verified": not problems,
        "problems": problems,
    }


# -- the cases ----------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    """What the optional cases need, found once per run."""

    wrk: str | None = None
    peers_dir: Path = DEFAULT_PEERS_DIR
    peer_pythons: dict[str, str] = field(default_factory=dict)


@contextmanager
def plain_table(url: str) -> Iterator[str]:
    """A fresh schema with the jobs table and ``plain_jobs`` beside it; yields the schema."""
    with database.run_schema(url, SCHEMA_PREFIX) as schema:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(
                statement_in(STATEMENTS, "plain_table_create", schema=sql.Identifier(schema))
            )
        yield schema


def _raw_case(url: str, settings: Settings, *, producers: int, copy: bool, batch: int) -> dict:
    with plain_table(url) as schema, ExitStack() as stack:
        connections = [
            stack.enter_context(psycopg.connect(url, autocommit=True, connect_timeout=10))
            for _ in range(producers)
        ]
        make = _raw_copy if copy else _raw_insert
        timing = run_producers(
            [make(conn, schema, batch) for conn in connections], settings.seconds, settings.warmup
        )
        return outcome(timing, count_rows(url, sql.Identifier(schema, "plain_jobs")))


def _queue_case(url: str, settings: Settings, *, producers: int, batch: int) -> dict:
    with (
        database.run_schema(url, SCHEMA_PREFIX) as schema,
        Queue.connect(url, schema=schema, min_size=producers, max_size=producers) as queue,
    ):
        timing = run_producers(
            [_queue_enqueue(queue, batch) for _ in range(producers)],
            settings.seconds,
            settings.warmup,
        )
        return outcome(timing, count_rows(url, sql.Identifier(schema, "jobs")))


def _wrk(wrk: str, port: int, path: str, body: Path, connections: int, seconds: int) -> dict:
    """One wrk run; what its script counted."""
    with resources.as_file(resources.files("pgqueue_bench").joinpath("wrk_post.lua")) as script:
        command = [wrk, "--threads", "1", "--connections", str(connections)]
        command += ["--duration", f"{seconds}s", "--timeout", "10s", "--script", str(script)]
        command += [f"http://127.0.0.1:{port}{path}", "--", str(body)]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + CASE_OVERHEAD_TIMEOUT
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith(WRK_MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk exited {done.returncode}: {done.stderr.strip() or done.stdout}")
    return json.loads(lines[-1].removeprefix(WRK_MARKER))


def _answered(counted: dict) -> int:
    return counted["requests"] - counted["errors"]["status"]


def _http_case(url: str, settings: Settings, tools: Tools, *, batch: int) -> dict:
    assert tools.wrk is not None
    if batch == 1:
        path, body = "/jobs", {"task": TASK, "payload": {"seq": 0}, "queue": QUEUE_NAME}
    else:
        jobs = [{"task": TASK, "payload": {"seq": n}, "queue": QUEUE_NAME} for n in range(batch)]
        path, body = "/jobs/batch", {"jobs": jobs}
    with (
        database.run_schema(url, SCHEMA_PREFIX) as schema,
        tempfile.TemporaryDirectory(prefix="pgqueue-enqueue-") as folder,
    ):
        body_file = Path(folder) / "body.json"
        body_file.write_text(json.dumps(body))
        # Leaving the block stops the API, which finishes what is in flight first.
        with apiserver.api_process(url, schema, settings.api_workers) as port:
            load = (tools.wrk, port, path, body_file, settings.connections)
            warm = _wrk(*load, settings.wrk_warmup_seconds)
            measured = _wrk(*load, settings.wrk_seconds)
        stored = count_rows(url, sql.Identifier(schema, "jobs"))
    seconds = measured["duration_us"] / 1e6
    answered = _answered(measured)
    timing = Timing(
        jobs=answered * batch,
        calls=answered,
        seconds=seconds,
        warmup_jobs=_answered(warm) * batch,
    )
    run = outcome(timing, stored, extra_allowed=2 * settings.connections * batch)
    errors = {
        f"{phase} {kind}": number
        for phase, counted in (("warm-up", warm), ("measured", measured))
        for kind, number in counted["errors"].items()
        if number
    }
    if errors:
        run["problems"].append(f"wrk saw errors: {errors}")
        run["verified"] = False
    return {
        **run,
        "requests_per_second": answered / seconds if seconds > 0 else None,
        "latency_p50_ms": measured["latency_us"]["p50"] / 1000,
        "latency_p99_ms": measured["latency_us"]["p99"] / 1000,
        "latency_max_ms": measured["latency_us"]["max"] / 1000,
    }


def _run_peer_script(python: str, script: Path, *args: str, timeout: float) -> str:
    done = subprocess.run(
        [python, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=script.parent,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{script.name} {args[0]} exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return done.stdout


def _peer_case(url: str, settings: Settings, tools: Tools, *, peer: str, batch: int) -> dict:
    python = tools.peer_pythons[peer]
    timeout = settings.warmup + settings.seconds + CASE_OVERHEAD_TIMEOUT
    with database.fresh_database(url, f"{SCHEMA_PREFIX}_{peer}") as peer_url:
        _run_peer_script(
            python, tools.peers_dir / f"peer_{peer}.py", "setup", "--database-url", peer_url,
            timeout=timeout,
        )  # fmt: skip
        printed = _run_peer_script(
            python,
            tools.peers_dir / f"enqueue_{peer}.py",
            "--database-url", peer_url,
            "--batch-size", str(batch),
            "--seconds", str(settings.seconds),
            "--warmup", str(settings.warmup),
            timeout=timeout,
        )  # fmt: skip
        timing = Timing(**json.loads(printed.strip().splitlines()[-1]))
        return outcome(timing, count_rows(peer_url, sql.Identifier(PEER_TABLES[peer])))


def run_case(name: str, url: str, settings: Settings, tools: Tools) -> dict[str, Any]:
    """Measure case ``name`` once on a fresh schema (peers: a fresh database)."""
    batch = settings.batch_size
    n = settings.connections
    runners: dict[str, Callable[[], dict]] = {
        "raw-insert-1": lambda: _raw_case(url, settings, producers=1, copy=False, batch=1),
        "raw-insert-16": lambda: _raw_case(url, settings, producers=n, copy=False, batch=1),
        "enqueue-1": lambda: _queue_case(url, settings, producers=1, batch=1),
        "enqueue-16": lambda: _queue_case(url, settings, producers=n, batch=1),
        "raw-multirow": lambda: _raw_case(url, settings, producers=1, copy=False, batch=batch),
        "raw-copy": lambda: _raw_case(url, settings, producers=1, copy=True, batch=batch),
        "enqueue-many": lambda: _queue_case(url, settings, producers=1, batch=batch),
        "http-jobs": lambda: _http_case(url, settings, tools, batch=1),
        "http-batch": lambda: _http_case(url, settings, tools, batch=settings.http_batch_size),
        "pgqueuer-single": lambda: _peer_case(url, settings, tools, peer="pgqueuer", batch=1),
        "pgqueuer-batch": lambda: _peer_case(url, settings, tools, peer="pgqueuer", batch=batch),
        "procrastinate-single": lambda: _peer_case(
            url, settings, tools, peer="procrastinate", batch=1
        ),
        "procrastinate-batch": lambda: _peer_case(
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


def _peer_pythons(pairs: Sequence[str], peers_dir: Path) -> dict[str, str]:
    pythons = {}
    for pair in pairs:
        name, sep, python = pair.partition("=")
        if not sep or name not in PEERS:
            raise click.BadParameter(
                f"{pair!r}: expected NAME=PYTHON with NAME one of {', '.join(PEERS)}",
                param_hint="--peer",
            )
        # Absolute but not resolved: a virtualenv's python is a link to the base one.
        pythons[name] = os.path.abspath(python)
        if not os.access(pythons[name], os.X_OK):
            raise click.BadParameter(f"{python} is not an executable Python", param_hint="--peer")
    if pythons and not (peers_dir / "enqueue_pgqueuer.py").exists():
        raise click.BadParameter(
            f"{peers_dir} has no peer scripts: run from the repository's root or give --peers-dir",
            param_hint="--peers-dir",
        )
    return pythons


def _wrk_version(wrk: str | None) -> str | None:
    if wrk is None:
        return None
    done = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=30)
    found = re.search(r"wrk (\S+)", done.stdout + done.stderr)
    return found.group(1) if found else None


def _peer_versions(tools: Tools) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for peer, python in tools.peer_pythons.items():
        printed = _run_peer_script(
            python, tools.peers_dir / f"peer_{peer}.py", "version", timeout=CASE_OVERHEAD_TIMEOUT
        )
        versions[peer] = json.loads(printed.strip().splitlines()[-1])[peer]
    return versions


# -- summary --------------------------------------------------------------------------

SPREAD_FIGURES = ("jobs_per_second", "requests_per_second", "latency_p50_ms", "latency_p99_ms")


def summarize(runs: list[dict[str, Any]], skipped: dict[str, str]) -> dict[str, Any]:
    """Per case, the spread of each figure over the verified runs; the ratios of the
    medians and the bounds, each with whether it holds; and what was skipped."""
    cases: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(run["case"] for run in runs):
        counted = [run for run in runs if run["case"] == name and run["verified"]]
        cases[name] = {
            figure: results.spread(run[figure] for run in counted)
            for figure in SPREAD_FIGURES
            if any(figure in run for run in runs if run["case"] == name)
        }
        cases[name]["runs_not_counted"] = sum(
            1 for run in runs if run["case"] == name and not run["verified"]
        )

    def median(case: str, figure: str = "jobs_per_second") -> float | None:
        return cases.get(case, {}).get(figure, {}).get("median")

    ratios = []
    for numerator, denominator, at_least in RATIOS:
        top, bottom = median(numerator), median(denominator)
        value = top / bottom if top and bottom else None
        ratios.append(
            {
                "numerator": numerator,
                "denominator": denominator,
                "ratio": value,
                "at_least": at_least,
                "holds": None if value is None else value >= at_least,
            }
        )
    bounds = []
    for case, figure, kind, bound in BOUNDS:
        value = median(case, figure)
        holds = None if value is None else (value >= bound if kind == "min" else value <= bound)
        bounds.append({"case": case, "figure": figure, "kind": kind, "bound": bound,
                       "median": value, "holds": holds})  # fmt: skip
    return {"cases": cases, "ratios": ratios, "bounds": bounds, "skipped": skipped}


def _describe_run(run: dict[str, Any]) -> str:
    text = f"{run['case']:>22}: "
    if "error" in run:
        return text + f"FAILED: {run['error']}"
    text += f"{run['jobs_per_second'] or 0:,.0f} jobs/s"
    if "requests_per_second" in run:
        text += (
            f", {run['requests_per_second'] or 0:,.0f} req/s, p50 {run['latency_p50_ms']:.1f} ms, "
            f"p99 {run['latency_p99_ms']:.1f} ms"
        )
    text += f" ({run['jobs']:,} jobs in {run['seconds']:.2f} s, load {run['load_average_1m']})"
    return text + ("" if run["verified"] else f"; NOT counted: {'; '.join(run['problems'])}")


def _describe_ratio(ratio: dict[str, Any]) -> str:
    value = ratio["ratio"]
    shown = "-" if value is None else f"{value:.2f}x"
    verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[ratio["holds"]]
    return (
        f"{ratio['numerator']} / {ratio['denominator']}: {shown} "
        f"(at least {ratio['at_least']:g}x: {verdict})"
    )


def _describe_bound(bound: dict[str, Any]) -> str:
    value = bound["median"]
    shown = "-" if value is None else f"{value:,.1f}"
    sign = ">=" if bound["kind"] == "min" else "<="
    verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[bound["holds"]]
    return f"{bound['case']} {bound['figure']}: {shown} ({sign} {bound['bound']:,g}: {verdict})"


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
@click.option(
    "--peers-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_PEERS_DIR,
    show_default=True,
    help="Where the peer scripts are (the repository's bench/peers).",
)
@click.option("--database-url", envvar="DATABASE_URL", help="Default: the embedded PostgreSQL.")
@click.option("--results-dir", type=click.Path(file_okay=False), help="Default: ./results.")
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
    peers_dir: Path,
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
    tools = Tools(
        wrk=shutil.which("wrk"),
        peers_dir=peers_dir.absolute(),
        peer_pythons=_peer_pythons(peers, peers_dir),
    )
    # Asked first: a peer's environment that cannot even say its version fails here,
    # before minutes of measuring.
    versions = {"wrk": _wrk_version(tools.wrk), **_peer_versions(tools)}
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
                progress.log(_describe_run(run))
    summary = summarize(runs, skipped)
    for ratio in summary["ratios"]:
        click.echo(_describe_ratio(ratio))
    for bound in summary["bounds"]:
        click.echo(_describe_bound(bound))
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
        environment=environment.describe(
            target.url,
            target.server,
            **{"pgqueue-api": environment.package_versions(("pgqueue-api",))["pgqueue-api"]},
            **versions,
        ),
        parameters=parameters,
        runs=runs,
        summary=summary,
    )
    path = results.write(results_name, document, results_dir)
    click.echo(f"wrote {path}")
    if any(not run["verified"] for run in runs):
        raise click.ClickException("some runs were not verified: see above")
