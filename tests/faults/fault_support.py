"""The harness of the fault scenarios: real ``pgqueue worker`` processes and producers
under load on a private PostgreSQL, and the verdict on what they left behind.

A run's evidence comes from four places that do not depend on each other:

- the producers' own record of every enqueue the queue acknowledged (a batch that was
  refused is retried with the same idempotency keys until it is acknowledged);
- the jobs table, read through :class:`pgqueue.Queue`;
- an audit trail written by a trigger in the same transaction as every state change
  (:mod:`pgqueue_bench.verdict.audit`), which holds each committed ack exactly once;
- the worker processes' local files: one line per handler invocation, and the JSON log
  line the worker writes for each ack it saw commit.

The verdict then says which acknowledged enqueues were lost, which jobs were acked twice
or acked by an attempt other than the one the table kept, and how many handler runs
were repeats (at-least-once allows those).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import fault_sql
import httpx
from fault_tasks import RUN_DIR_VARIABLE, WORK_TASK
from polling import wait_for
from processes import python_path
from serving import serve

from pgqueue import DatabaseUnavailable, JobSpec, JobState, Queue, migrate
from pgqueue_api import ApiSettings, create_app
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.verdict import audit, deliveries, observe
from pgqueue_bench.verdict.producers import Producer, Send, send_via_queue
from pgqueue_bench.verdict.producers import send_via_api as send_via_api  # the scenarios' import

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
    audit.install(url, schema)


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
        super().__init__(
            url,
            schema,
            settings,
            log_dir,
            stop_timeout=20,
            prefix=prefix,
            environment={"PYTHONPATH": python_path(HERE), RUN_DIR_VARIABLE: str(run_dir)},
        )
        self.run_dir = run_dir

    def discarded_outcomes(self) -> set[int]:
        """Ids of the jobs whose outcome these workers discarded (their lease was lost)."""
        found = set()
        for path in self.log_dir.glob("worker-*.log"):
            for line in deliveries.complete_lines(path):
                if line.startswith("{") and "outcome discarded" in line:
                    found.add(json.loads(line)["job_id"])
        return found

    def logs(self) -> str:
        """Every line the workers logged so far."""
        return "\n".join(
            path.read_text(errors="replace") for path in sorted(self.log_dir.glob("worker-*.log"))
        )


# -- producers ---------------------------------------------------------------------------


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
        return {
            job_id
            for job_id, _, _, ran_in in deliveries.read_invocations(self.run_dir)
            if ran_in == pid
        }

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
        transitions = audit.transitions(self.url, self.schema)
        logged = deliveries.worker_acks(sorted(self.run_dir.glob("*/worker-*.log")))
        judged = audit.judge(
            self.acknowledged(),
            {job_id: job.state.value for job_id, job in jobs.items()},
            transitions,
            logged,
            wanted=[state.value for state in expect],
        )
        runs = deliveries.read_invocations(self.run_dir)
        # Without evidence from the workers, the checks against it would pass vacuously.
        assert not judged.acks_written or (runs and logged), (
            "no handler or ack evidence from the workers"
        )
        states = Counter(job.state.value for job in jobs.values())
        if judged.pruned:
            states["pruned"] = judged.pruned
        return Verdict(
            jobs=len(self.acknowledged()),
            lost=judged.lost,
            double_acks=judged.double_acks,
            contradicted_acks=judged.contradicted_acks,
            unacknowledged=judged.unacknowledged,
            states=dict(states),
            acks_logged=len(logged),
            handler_runs=len(runs),
            redeliveries=len(runs) - len({job_id for job_id, *_ in runs}),
            failed_attempts=judged.failed_attempts,
            finished_at=[job.finished_at for job in jobs.values() if job.finished_at is not None],
        )

    def worker_logs(self) -> str:
        return "\n".join(fleet.logs() for fleet in self.fleets)
