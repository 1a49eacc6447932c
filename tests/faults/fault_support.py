"""The harness of the fault scenarios: real ``pgqueue worker`` processes and producers
under load on a private PostgreSQL, and the verdict on what they left behind.

A run's evidence comes from four places that do not depend on each other:

- the producers' own record of every enqueue the queue acknowledged (a batch that was
  refused is retried with the same idempotency keys until it is acknowledged);
- the jobs table, read through :class:`pgqueue.Queue`;
- an audit trail written by a trigger in the same transaction as every state change
  (``faults.sql``), which holds each committed ack exactly once;
- the worker processes' local files: one line per handler invocation, and the JSON log
  line the worker writes for each ack it saw commit.

The verdict then says which acknowledged enqueues were lost, which jobs were acked twice
or acked by an attempt other than the one the table kept, and how many handler runs
were repeats (at-least-once allows those).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import islice, pairwise
from pathlib import Path
from typing import Any

import fault_sql
import httpx
from fault_tasks import INVOCATION_LOG_PREFIX, RUN_DIR_VARIABLE, WORK_TASK
from polling import wait_for
from processes import python_path
from serving import serve

from pgqueue import DatabaseUnavailable, JobSpec, JobState, Queue, migrate
from pgqueue_api import ApiSettings, create_app
from pgqueue_bench import observe
from pgqueue_bench.fleet import WorkerFleet, WorkerSettings

HERE = Path(__file__).resolve().parent
SCHEMA = "faults"
QUEUE_NAME = "default"

# Short leases and intervals, so that expiry, reaping and retries happen within seconds.
# A job gets many attempts: the scenarios are about loss, not about retry policy.
FAST_WORKERS = WorkerSettings(
    queue=QUEUE_NAME,
    concurrency=4,
    lease_seconds=2.0,
    heartbeat_seconds=0.4,
    poll_interval=0.25,
    reap_interval=0.25,
    retry_base=0.05,
    retry_cap=0.5,
    shutdown_timeout=10,
    extra_args=("--plugin", "fault_tasks", "--no-plugin-autoload"),
)
MAX_ATTEMPTS = 25


def database_now(url: str) -> datetime:
    """The database clock; every duration a scenario reports is measured on it."""
    return fault_sql.run(url, "database_now")[0]["now"]


def prepare_schema(url: str, schema: str = SCHEMA) -> None:
    """Migrate ``schema`` and install the audit trail on its jobs table."""
    migrate(url, schema)
    fault_sql.run(url, "audit_install", schema=schema)


# -- worker processes -------------------------------------------------------------------


def worker_settings(**changes: Any) -> WorkerSettings:
    """FAST_WORKERS with some settings changed."""
    return replace(FAST_WORKERS, **changes)


class FaultWorkers(WorkerFleet):
    """``pgqueue worker`` processes running :mod:`fault_tasks`. Their logs go to
    ``log_dir``; the tasks' invocation logs go to the run's directory, shared by every
    group of workers in the run."""

    def __init__(
        self,
        url: str,
        schema: str,
        settings: WorkerSettings,
        log_dir: Path,
        run_dir: Path,
        *,
        prefix: tuple[str, ...] = (),
    ) -> None:
        super().__init__(url, schema, settings, log_dir, stop_timeout=20)
        self.run_dir = run_dir
        self.prefix = prefix

    def command(self) -> list[str]:
        """The worker's command line, after ``prefix`` (to run it in a namespace, say)."""
        return [*self.prefix, *super().command()]

    def environment(self) -> dict[str, str]:
        return {
            **super().environment(),
            "PYTHONPATH": python_path(HERE),
            RUN_DIR_VARIABLE: str(self.run_dir),
        }

    def wait_serving(self, timeout: float = 120.0) -> None:
        """Wait until every worker has said it serves its queue (on a loaded machine a
        worker takes seconds to start; a fault injected before would hit nothing)."""

        def serving() -> bool:
            assert not self.unexpected_exits(), f"a worker exited:\n{self.log_tail()}"
            logs = sorted(self.log_dir.glob("worker-*.log"))
            return len(logs) == len(self.processes) and all(
                " serving queue" in path.read_text(errors="replace") for path in logs
            )

        wait_for(serving, timeout, what="the workers to serve")

    def discarded_outcomes(self) -> set[int]:
        """Ids of the jobs whose outcome these workers discarded (their lease was lost)."""
        found = set()
        for path in self.log_dir.glob("worker-*.log"):
            for line in _complete_lines(path):
                if line.startswith("{") and "outcome discarded" in line:
                    found.add(json.loads(line)["job_id"])
        return found

    def logs(self) -> str:
        """Every line the workers logged so far."""
        return "\n".join(
            path.read_text(errors="replace") for path in sorted(self.log_dir.glob("worker-*.log"))
        )


# -- producers ---------------------------------------------------------------------------


class Refused(Exception):
    """The queue did not take a batch this time (503, connection error); retry it."""


Send = Callable[[list[JobSpec]], list[int]]


def send_via_queue(queue: Queue) -> Send:
    """Enqueue through ``Queue.enqueue_many``; DatabaseUnavailable means retry."""

    def send(specs: list[JobSpec]) -> list[int]:
        try:
            return [result.job.id for result in queue.enqueue_many(specs)]
        except DatabaseUnavailable as exc:
            raise Refused(str(exc)) from exc

    return send


def send_via_api(client: httpx.Client) -> Send:
    """Enqueue through ``POST /jobs/batch``; 503 or a broken connection means retry,
    anything else but 201 is a failure of the test."""

    def send(specs: list[JobSpec]) -> list[int]:
        body = {"jobs": [_job_body(spec) for spec in specs]}
        try:
            response = client.post("/jobs/batch", json=body)
        except httpx.TransportError as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 503:
            assert response.headers.get("retry-after"), response.headers
            raise Refused(response.json()["detail"])
        assert response.status_code == 201, response.text
        return [item["job"]["id"] for item in response.json()["items"]]

    return send


def _job_body(spec: JobSpec) -> dict[str, Any]:
    return {
        "task": spec.task,
        "payload": spec.payload,
        "queue": spec.queue,
        "idempotency_key": spec.idempotency_key,
        "max_attempts": spec.max_attempts,
    }


def work_jobs(
    count: int, prefix: str, *, max_attempts: int = MAX_ATTEMPTS, **payload: Any
) -> list[JobSpec]:
    """``count`` jobs of the recording task, each with an idempotency key of its own."""
    return list(iter_work_jobs(count, prefix, max_attempts=max_attempts, **payload))


def iter_work_jobs(
    count: int, prefix: str, *, max_attempts: int = MAX_ATTEMPTS, **payload: Any
) -> Iterator[JobSpec]:
    """:func:`work_jobs`, one at a time (a long run's producer makes them as it goes)."""
    payload = {"ms": [10, 40], **payload}
    for n in range(count):
        yield JobSpec(
            WORK_TASK,
            payload,
            queue=QUEUE_NAME,
            idempotency_key=f"{prefix}-{n}",
            max_attempts=max_attempts,
        )


class Producer:
    """Sends ``specs`` in batches from a thread of its own, at a steady pace, retrying
    a refused batch (with the same idempotency keys) until the queue acknowledges it.

    ``acknowledged`` maps each key to the job id the queue answered with: exactly the
    enqueues a client was told had committed. ``refusals`` holds what the refusals said.
    """

    def __init__(
        self, send: Send, specs: Iterable[JobSpec], *, batch: int = 8, pause: float = 0.02
    ) -> None:
        self.send = send
        self.specs = iter(specs)
        self.batch = batch
        self.pause = pause
        self.acknowledged: dict[str, int] = {}
        self.refusals: list[str] = []
        self.error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-producer", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        """True once every batch was acknowledged (or the producer stopped or failed)."""
        return not self._thread.is_alive()

    def wait(self, timeout: float = 120.0) -> None:
        """Wait until every batch was acknowledged; re-raise what the thread raised."""
        wait_for(lambda: self.done, timeout, what="the producer to finish")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Send no more batches (the one in flight is finished first)."""
        self._stopped.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            while chunk := list(islice(self.specs, self.batch)):
                delay = 0.05
                while not self._stopped.is_set():
                    try:
                        ids = self.send(chunk)
                        break
                    except Refused as exc:
                        self.refusals.append(str(exc))
                        self._stopped.wait(delay)
                        delay = min(delay * 2, 1.0)
                else:
                    return
                for spec, job_id in zip(chunk, ids, strict=True):
                    self.acknowledged[spec.idempotency_key] = job_id  # type: ignore[index]
                if self._stopped.wait(self.pause):
                    return
        except BaseException as exc:
            self.error = exc


# -- the HTTP API -----------------------------------------------------------------------


@contextlib.contextmanager
def serve_api(settings: ApiSettings) -> Iterator[httpx.Client]:
    """The real app under uvicorn on a thread, on a free loopback port; yields a client."""
    with (
        serve(create_app(settings)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield client


# -- a run -------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What a run left behind, checked against what producers and workers were told."""

    jobs: int
    """Acknowledged enqueues."""
    lost: list[str] = field(default_factory=list)
    """Acknowledged enqueues missing from the table or not in an expected final state."""
    double_acks: list[int] = field(default_factory=list)
    """Jobs whose audit trail holds more than one committed ack."""
    contradicted_acks: list[tuple[int, int]] = field(default_factory=list)
    """(job, attempt) acks a worker logged as committed that the audit trail does not
    hold: the job finished otherwise, or by another attempt, or was logged twice."""
    unacknowledged: list[int] = field(default_factory=list)
    """Jobs in the table (or pruned from it) that no producer was told about."""
    states: dict[str, int] = field(default_factory=dict)
    acks_logged: int = 0
    """Acks the workers logged as committed."""
    handler_runs: int = 0
    redeliveries: int = 0
    """Handler runs beyond the first of each job: at-least-once allows them."""
    failed_attempts: int = 0
    """Attempts that ended back in queued or dead: failed by a worker, or reaped."""
    finished_at: list[datetime] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        """Jobs completed twice, as the database or the workers tell it."""
        return len(self.double_acks) + len(self.contradicted_acks)

    def broken_promises(self, also_enqueued: Iterable[int] = ()) -> dict[str, list[Any]]:
        """The at-least-once promises this run broke, each with its evidence; empty when
        every one held. ``also_enqueued``: ids of rows the test wrote around the
        producers (raw inserts), which must be exactly the unacknowledged ones."""
        checks: dict[str, list[Any]] = {
            "lost": self.lost,
            "unacknowledged": sorted(set(self.unacknowledged) ^ set(also_enqueued)),
            "double_acks": self.double_acks,
            "contradicted_acks": self.contradicted_acks,
        }
        return {promise: evidence for promise, evidence in checks.items() if evidence}

    def recovery_seconds(self, since: datetime) -> float | None:
        """From ``since`` (the fault removed) to the first job finished after it."""
        after = [at for at in self.finished_at if at >= since]
        return round((min(after) - since).total_seconds(), 3) if after else None

    def pause_seconds(self) -> float | None:
        """The longest gap between two consecutive finished jobs: how long the fault
        stopped the queue, as its output shows it."""
        times = sorted(self.finished_at)
        if len(times) < 2:
            return None
        return round(max((b - a).total_seconds() for a, b in pairwise(times)), 3)

    def figures(self, **extra: Any) -> dict[str, Any]:
        """The scenario's figures for results/faults.json."""
        return {
            "jobs": self.jobs,
            "lost": len(self.lost),
            "duplicates": self.duplicates,
            "redeliveries": self.redeliveries,
            "handler_runs": self.handler_runs,
            "failed_attempts": self.failed_attempts,
            "pause_seconds": self.pause_seconds(),
            **extra,
        }


class FaultRun:
    """One scenario's load on a private server: worker processes, producers, and the
    verdict. ``url`` is the direct connection the test itself uses to watch; workers
    and the API may be given another (through a proxy, or a multi-host string)."""

    def __init__(self, url: str, run_dir: Path, *, schema: str = SCHEMA) -> None:
        self.url = url
        self.schema = schema
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.queue = Queue.connect(url, schema=schema, max_size=4, pool_timeout=10)
        self.fleets: list[FaultWorkers] = []
        self.producers: list[Producer] = []
        self._enqueued: dict[str, int] = {}

    @classmethod
    def prepared(cls, url: str, run_dir: Path, *, schema: str = SCHEMA) -> FaultRun:
        """A run on a newly migrated, audited schema."""
        prepare_schema(url, schema)
        return cls(url, run_dir, schema=schema)

    def __enter__(self) -> FaultRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for producer in self.producers:
            producer.stop()
        for fleet in self.fleets:
            fleet.stop()
        self.queue.close()

    # -- load --------------------------------------------------------------------

    def start_workers(
        self,
        count: int = 2,
        *,
        url: str | None = None,
        name: str | None = None,
        prefix: tuple[str, ...] = (),
        **settings: Any,
    ) -> FaultWorkers:
        """Start ``count`` worker processes on ``url`` (default: the run's own), their
        command lines after ``prefix``; return once they serve."""
        log_dir = self.run_dir / (name or f"workers-{len(self.fleets) + 1}")
        fleet = FaultWorkers(
            url or self.url,
            self.schema,
            worker_settings(**settings),
            log_dir,
            self.run_dir,
            prefix=prefix,
        )
        self.fleets.append(fleet)
        fleet.start(count)
        fleet.wait_serving()
        return fleet

    def produce(
        self,
        count: int,
        *,
        send: Send | None = None,
        prefix: str | None = None,
        batch: int = 8,
        pause: float = 0.02,
        max_attempts: int = MAX_ATTEMPTS,
        **payload: Any,
    ) -> Producer:
        """Start a producer of ``count`` recording jobs (through ``send``, by default
        this run's own Queue); ``payload`` goes to each job."""
        prefix = prefix or f"p{len(self.producers) + 1}"
        producer = Producer(
            send or send_via_queue(self.queue),
            iter_work_jobs(count, prefix, max_attempts=max_attempts, **payload),
            batch=batch,
            pause=pause,
        )
        self.producers.append(producer)
        return producer.start()

    def enqueue(self, specs: list[JobSpec]) -> list[int]:
        """Enqueue ``specs`` now, through the run's Queue, as an acknowledged producer."""
        ids = [result.job.id for result in self.queue.enqueue_many(specs)]
        self.acknowledge(
            {
                spec.idempotency_key or f"id-{job_id}": job_id
                for spec, job_id in zip(specs, ids, strict=True)
            }
        )
        return ids

    def acknowledge(self, enqueued: dict[str, int]) -> None:
        """Count these enqueues (key -> job id), acknowledged to the test, in the verdict."""
        self._enqueued.update(enqueued)

    # -- watching ----------------------------------------------------------------

    def now(self) -> datetime:
        return database_now(self.url)

    def handled_by(self, pid: int) -> set[int]:
        """Ids of the jobs whose handler ran in worker process ``pid``."""
        return {job_id for job_id, _, _, ran_in in invocations(self.run_dir) if ran_in == pid}

    def claimed_by(self, pid: int, state: str = "running") -> list[int]:
        """Ids of the jobs in ``state`` last claimed by worker process ``pid`` (a worker
        id is host:pid:nonce)."""
        jobs = self.queue.list(state=state, limit=1000).jobs
        return [job.id for job in jobs if (job.worker_id or "").split(":")[-2:-1] == [str(pid)]]

    def held_by_cut_off(self, pid: int) -> list[int]:
        """The jobs still running under worker ``pid`` once it was cut off: statements it
        sent just before may still commit, so read until two reads agree."""
        previous = None
        while True:
            held = self.claimed_by(pid)
            if held == previous:
                return held
            previous = held
            time.sleep(0.1)

    def counts(self) -> dict[str, int] | None:
        """Jobs per state, or None while the database cannot answer."""
        try:
            return observe.state_counts(self.queue, QUEUE_NAME)
        except DatabaseUnavailable:
            return None

    def check_workers(self) -> None:
        """Fail, with their logs, if any worker process exited on its own."""
        for fleet in self.fleets:
            exits = fleet.unexpected_exits()
            assert not exits, f"workers exited {exits}:\n{fleet.log_tail()}"

    def wait_until_succeeded(self, count: int, timeout: float = 120.0) -> None:
        """Wait until at least ``count`` jobs succeeded."""

        def enough() -> bool:
            self.check_workers()
            counts = self.counts()
            return counts is not None and counts["succeeded"] >= count

        wait_for(enough, timeout, what=f"{count} jobs to succeed")

    def wait_until_done(self, timeout: float = 180.0) -> None:
        """Wait until every producer is done and every job in the table has finished."""

        def finished() -> bool:
            self.check_workers()
            if not all(producer.done for producer in self.producers):
                return False
            counts = self.counts()
            return counts is not None and counts["queued"] + counts["running"] == 0

        try:
            wait_for(finished, timeout, what="every job to finish")
        except AssertionError:
            tails = "\n".join(fleet.log_tail(40) for fleet in self.fleets)
            raise AssertionError(f"jobs left unfinished: {self.counts()}\n{tails}") from None
        for producer in self.producers:
            producer.wait(0)

    # -- the verdict --------------------------------------------------------------

    def acknowledged(self) -> dict[str, int]:
        """Every enqueue a producer was told had committed: key -> job id."""
        merged = dict(self._enqueued)
        for producer in self.producers:
            merged.update(producer.acknowledged)
        return merged

    def verdict(self, expect: tuple[JobState, ...] = (JobState.SUCCEEDED,)) -> Verdict:
        """Check the table, the audit trail and the workers' evidence against each other.

        A job pruned during the run is judged by the state the audit trail saw it
        leave the table in."""
        jobs = {job.id: job for job in observe.all_jobs(self.queue)}
        transitions = fault_sql.run(self.url, "audit_transitions", schema=self.schema)
        pruned = {
            row["job_id"]: row["from_state"] for row in transitions if row["to_state"] == "pruned"
        }
        final = {job_id: job.state.value for job_id, job in jobs.items()} | {
            job_id: state for job_id, state in pruned.items() if job_id not in jobs
        }
        wanted = {state.value for state in expect}
        acknowledged = self.acknowledged()
        lost = [key for key, job_id in acknowledged.items() if final.get(job_id) not in wanted]
        # Each committed ack, as (job, attempt); a job can be acked once at most.
        acks_written = Counter(
            (row["job_id"], row["attempts"])
            for row in transitions
            if row["from_state"] == "running" and row["to_state"] == "succeeded"
        )
        acked_jobs = Counter(job_id for job_id, _ in acks_written.elements())
        logged = worker_acks(self.run_dir)
        logged_count = Counter(job_id for job_id, _ in logged)
        contradicted = [
            (job_id, attempt)
            for job_id, attempt in logged
            if (job_id, attempt) not in acks_written or logged_count[job_id] > 1
        ]
        runs = invocations(self.run_dir)
        # Without evidence from the workers, the checks against it would pass vacuously.
        assert not acks_written or (runs and logged), "no handler or ack evidence from the workers"
        states = Counter(job.state.value for job in jobs.values())
        if pruned:
            states["pruned"] = len(pruned)
        return Verdict(
            jobs=len(acknowledged),
            lost=lost,
            double_acks=sorted(job_id for job_id, n in acked_jobs.items() if n > 1),
            contradicted_acks=contradicted,
            unacknowledged=sorted(set(final) - set(acknowledged.values())),
            states=dict(states),
            acks_logged=len(logged),
            handler_runs=len(runs),
            redeliveries=len(runs) - len({job_id for job_id, *_ in runs}),
            failed_attempts=sum(
                1
                for row in transitions
                if row["from_state"] == "running" and row["to_state"] in ("queued", "dead")
            ),
            finished_at=[job.finished_at for job in jobs.values() if job.finished_at is not None],
        )

    def worker_logs(self) -> str:
        return "\n".join(fleet.logs() for fleet in self.fleets)


def _complete_lines(path: Path) -> list[str]:
    """The lines of a file another process may be appending to right now: a last line
    without its newline is still being written, and is left for later."""
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    return lines[:-1]  # after the last newline: empty, or a line being written


def invocations(run_dir: Path) -> list[tuple[int, int, str, int]]:
    """(job id, attempt, lease token, pid) of every handler invocation in the run."""
    found = []
    for path in run_dir.glob(f"{INVOCATION_LOG_PREFIX}*.log"):
        for line in _complete_lines(path):
            job_id, attempt, token, pid = line.split()
            found.append((int(job_id), int(attempt), token, int(pid)))
    return found


def worker_acks(run_dir: Path) -> list[tuple[int, int]]:
    """(job id, attempt) of every ack a worker logged as committed (the ``succeeded``
    line of core's lifecycle log, written after the ack's commit)."""
    found = []
    for path in run_dir.glob("*/worker-*.log"):
        for line in _complete_lines(path):
            if not line.startswith("{"):
                continue  # not the worker's own JSON: a warning printed by a library
            record = json.loads(line)
            if record.get("logger") == "pgqueue.jobs" and record.get("state") == "succeeded":
                found.append((record["job_id"], record["attempt"]))
    return found


def quiet_pool_logs() -> None:
    """psycopg's pool logs a warning for every connection a fault breaks; the scenarios
    break many on purpose, and say so themselves."""
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    logging.getLogger("psycopg").setLevel(logging.ERROR)
