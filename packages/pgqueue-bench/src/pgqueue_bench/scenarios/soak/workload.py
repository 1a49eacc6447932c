"""The soak's workload: a steady, mixed stream of jobs, and an operator who cancels,
retries, fans out and prunes while it runs.

Jobs come in over both producer paths at fixed rates: in-process through
``Queue.enqueue_many`` and over HTTP through ``POST /jobs/batch`` on a real
``pgqueue-api``. Their durations are log-uniform from 1 ms to 2 s (most jobs short, a
few long, as real queues see them); 5% fail on every attempt and go dead, 1% overrun a
1 s time limit. A second queue has a concurrency limit of 2 and its own trickle of
jobs. The operator thread adds what producers do not: fan-in groups (three jobs and a
fourth that depends on them), delayed jobs cancelled before they run, long jobs
cancelled while they run, retries of cancelled and of dead jobs, and retention: the
history is pruned to ``retention_seconds`` every ``prune_every`` seconds, as
``pgqueue prune --older-than`` from cron would.

Every enqueue carries an idempotency key and is resent until acknowledged, so the
acknowledged set (:attr:`Workload.acknowledged`) is exactly what clients were told
committed; the verdict holds the audit trail against it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from pgqueue import (
    BatchItem,
    DatabaseUnavailable,
    InvalidTransition,
    JobNotFound,
    JobSpec,
    JobState,
    Queue,
)
from pgqueue_bench.scenarios.soak.tasks import LIMITED_QUEUE, SOAK_QUEUE, WORK_TASK
from pgqueue_bench.verdict.producers import (
    Producer,
    send_until_acknowledged,
    send_via_api,
    send_via_queue,
)


@dataclass(frozen=True)
class WorkloadSettings:
    """Rates and shares of the workload; recorded in the results' parameters."""

    in_process_per_second: float = 8.0
    api_per_second: float = 4.0
    limited_per_second: float = 1.0
    limited_concurrency: int = 2
    batch: int = 4
    shortest_ms: float = 1.0
    longest_ms: float = 2000.0
    failing_share: float = 0.05
    timing_out_share: float = 0.01
    time_limit_seconds: float = 1.0
    max_attempts: int = 25
    """Ordinary jobs: enough that faults alone never make one dead."""
    failing_max_attempts: int = 3
    operator_every_seconds: float = 2.0
    cancel_delay_seconds: float = 15.0
    retention_seconds: float = 600.0
    prune_every_seconds: float = 60.0

    @classmethod
    def for_minutes(cls, minutes: float) -> WorkloadSettings:
        """The hour's workload; a run of less than 30 minutes keeps a minute of history
        (pruned every 15 s), so that it, too, sees the history fill up and stay full."""
        if minutes >= 30:
            return cls()
        return cls(retention_seconds=60.0, prune_every_seconds=15.0)


class JobMix:
    """Seeded job specs: each call to :meth:`main` or :meth:`limited` gives the next
    job of its stream, keyed ``<prefix>-<n>``."""

    def __init__(self, settings: WorkloadSettings, rng: random.Random, prefix: str) -> None:
        self.settings = settings
        self.rng = rng
        self.prefix = prefix
        self.count = 0

    def key(self) -> str:
        """The next idempotency key of this stream."""
        self.count += 1
        return f"{self.prefix}-{self.count}"

    def work_ms(self) -> float:
        """Log-uniform between the shortest and the longest duration."""
        low, high = math.log(self.settings.shortest_ms), math.log(self.settings.longest_ms)
        return round(math.exp(self.rng.uniform(low, high)), 1)

    def main(self) -> JobSpec:
        """One job of the main queue: failing, timing out, or ordinary."""
        s = self.settings
        draw = self.rng.random()
        payload: dict[str, bool | float]
        limit: float | None
        if draw < s.failing_share:
            payload, attempts, limit = {"fail": True}, s.failing_max_attempts, None
        elif draw < s.failing_share + s.timing_out_share:
            # Runs three times its limit: every attempt times out, then it is dead.
            ms = s.time_limit_seconds * 3000
            payload, attempts, limit = {"ms": ms}, 2, s.time_limit_seconds
        else:
            payload, attempts, limit = {"ms": self.work_ms()}, s.max_attempts, None
        return JobSpec(
            WORK_TASK,
            payload,
            queue=SOAK_QUEUE,
            idempotency_key=self.key(),
            max_attempts=attempts,
            timeout_seconds=limit,
        )

    def limited(self) -> JobSpec:
        """One job of the limited queue: 50-500 ms of work."""
        ms = round(self.rng.uniform(50, 500), 1)
        return JobSpec(
            WORK_TASK,
            {"ms": ms},
            queue=LIMITED_QUEUE,
            idempotency_key=self.key(),
            max_attempts=self.settings.max_attempts,
        )

    def stream(self, limited: bool = False) -> Iterator[JobSpec]:
        """Jobs without end, for a producer."""
        while True:
            yield self.limited() if limited else self.main()


class Operator:
    """Cancels, retries, fans out and prunes, once every ``operator_every_seconds``, in
    a thread of its own. A round the database refuses is counted and skipped."""

    def __init__(self, queue: Queue, settings: WorkloadSettings, rng: random.Random) -> None:
        self.queue = queue
        self.settings = settings
        self.rng = rng
        self.mix = JobMix(settings, rng, "op")
        self.send = send_via_queue(queue)
        self.acknowledged: dict[str, int] = {}
        self.counts: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._to_cancel: list[int] = []
        self._cancelled: list[int] = []
        self._last_prune = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-operator", daemon=True)

    def start(self) -> Operator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(60)

    def _enqueue(self, specs: list[JobSpec]) -> list[int] | None:
        ids = send_until_acknowledged(self.send, specs, self._stopped)
        if ids is not None:
            for spec, job_id in zip(specs, ids, strict=True):
                self.acknowledged[spec.idempotency_key] = job_id  # type: ignore[index]
        return ids

    def _fan_in(self) -> None:
        """Three jobs and a fourth waiting for them, in one batch."""
        group = [self.mix.main() for _ in range(3)]
        dependent = JobSpec(
            WORK_TASK,
            {"ms": self.mix.work_ms()},
            queue=SOAK_QUEUE,
            idempotency_key=self.mix.key(),
            max_attempts=self.settings.max_attempts,
            depends_on=[BatchItem(i) for i in range(3)],
        )
        if self._enqueue([*group, dependent]) is not None:
            self.counts["fan_in_groups"] += 1

    def _to_be_cancelled(self) -> None:
        """A delayed job (cancelled while queued) and a long one (likely running)."""
        delayed = JobSpec(
            WORK_TASK,
            {"ms": 5},
            queue=SOAK_QUEUE,
            idempotency_key=self.mix.key(),
            max_attempts=self.settings.max_attempts,
            delay_seconds=self.settings.cancel_delay_seconds,
        )
        long = JobSpec(
            WORK_TASK,
            {"ms": self.settings.longest_ms},
            queue=SOAK_QUEUE,
            idempotency_key=self.mix.key(),
            max_attempts=self.settings.max_attempts,
        )
        ids = self._enqueue([delayed, long])
        if ids is not None:
            self._to_cancel.extend(ids)

    def _cancel_and_retry(self) -> None:
        """Cancel last round's targets; retry half of those cancelled the round before,
        and now and then one dead job."""
        targets, self._to_cancel = self._to_cancel, []
        cancelled_now = []
        for job_id in targets:
            try:
                self.queue.cancel(job_id)
                self.counts["cancels"] += 1
                cancelled_now.append(job_id)
            except InvalidTransition:
                self.counts["cancels_too_late"] += 1  # it finished first
        retry_now = [job_id for job_id in self._cancelled if self.rng.random() < 0.5]
        self._cancelled = cancelled_now
        if self.rng.random() < 0.2:
            dead = self.queue.list(queue=SOAK_QUEUE, state=JobState.DEAD, limit=20).jobs
            if dead:
                retry_now.append(self.rng.choice(dead).id)
        for job_id in retry_now:
            try:
                self.queue.retry(job_id)
                self.counts["retries"] += 1
            except (InvalidTransition, JobNotFound):
                self.counts["retries_refused"] += 1

    def _prune(self) -> None:
        if time.monotonic() - self._last_prune < self.settings.prune_every_seconds:
            return
        self.counts["pruned"] += self.queue.prune(self.settings.retention_seconds)
        self.counts["prune_rounds"] += 1
        self._last_prune = time.monotonic()

    def _run(self) -> None:
        try:
            while not self._stopped.wait(self.settings.operator_every_seconds):
                try:
                    self._cancel_and_retry()
                    self._fan_in()
                    self._to_be_cancelled()
                    self._prune()
                except DatabaseUnavailable:
                    self.counts["rounds_refused"] += 1
        except BaseException as exc:
            self.error = exc


class Workload:
    """The producers and the operator of one soak, started and stopped together."""

    def __init__(
        self,
        queue: Queue,
        api: httpx.Client,
        settings: WorkloadSettings,
        seed: int,
    ) -> None:
        self.settings = settings
        batch = settings.batch
        streams = {
            "in_process": (send_via_queue(queue), settings.in_process_per_second, False),
            "api": (send_via_api(api), settings.api_per_second, False),
            "api_limited": (send_via_api(api), settings.limited_per_second, True),
        }
        self.producers: dict[str, Producer] = {}
        for n, (name, (send, rate, limited)) in enumerate(streams.items()):
            mix = JobMix(settings, random.Random(seed * 100 + n), name)
            size = 1 if limited else batch
            self.producers[name] = Producer(
                send, mix.stream(limited), batch=size, every=size / rate, name=f"soak-{name}"
            )
        self.operator = Operator(queue, settings, random.Random(seed * 100 + 99))

    def start(self) -> None:
        for producer in self.producers.values():
            producer.start()
        self.operator.start()

    def stop(self) -> None:
        """Stop every producer and the operator (each finishes what is in flight)."""
        for producer in self.producers.values():
            producer.stop()
        self.operator.stop()

    @property
    def acknowledged(self) -> dict[str, int]:
        """Every enqueue a client was told had committed: key -> job id."""
        merged = dict(self.operator.acknowledged)
        for producer in self.producers.values():
            merged.update(producer.acknowledged)
        return merged

    def errors(self) -> list[str]:
        """What made a producer or the operator stop early (nothing, normally)."""
        found = [
            f"{name}: {producer.error!r}"
            for name, producer in self.producers.items()
            if producer.error is not None
        ]
        if self.operator.error is not None:
            found.append(f"operator: {self.operator.error!r}")
        return found

    def figures(self) -> dict[str, object]:
        """What the workload did, for the results."""
        return {
            "acknowledged_by_producer": {
                name: len(producer.acknowledged) for name, producer in self.producers.items()
            }
            | {"operator": len(self.operator.acknowledged)},
            "refused_batches": {
                name: len(producer.refusals) for name, producer in self.producers.items()
            },
            "operator": dict(self.operator.counts),
            "errors": self.errors(),
        }
