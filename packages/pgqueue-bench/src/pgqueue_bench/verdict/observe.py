"""Reading a run's outcome from the jobs table, through :class:`pgqueue.Queue`, and,
for a run of recording jobs, the evidence of every delivery beside it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pgqueue import Job, JobSpec, JobState, Queue
from pgqueue_bench.verdict import deliveries
from pgqueue_bench.verdict.deliveries import DeliverySummary

PAGE_SIZE = 1000


def all_jobs(queue: Queue) -> list[Job]:
    """Every job in the queue's schema, oldest first."""
    jobs: list[Job] = []
    after: int | None = None
    while True:
        page = queue.list(limit=PAGE_SIZE, after=after)
        jobs.extend(page.jobs)
        if page.next_after is None:
            return sorted(jobs, key=lambda job: job.id)
        after = page.next_after


def state_counts(queue: Queue, queue_name: str) -> dict[str, int]:
    """How many jobs of ``queue_name`` are in each state, from one snapshot."""
    for stats in queue.stats():
        if stats.queue == queue_name:
            return dict(stats.counts)
    return {state.value: 0 for state in JobState}


def finished(counts: dict[str, int]) -> int:
    """Jobs that reached a final state."""
    return sum(counts.get(state.value, 0) for state in JobState if state.finished)


def enqueue_in_batches(queue: Queue, specs: list[JobSpec], batch: int = 1000) -> list[int]:
    """Enqueue ``specs`` in statements of ``batch`` jobs; return the job ids."""
    ids: list[int] = []
    for start in range(0, len(specs), batch):
        ids += [r.job.id for r in queue.enqueue_many(specs[start : start + batch])]
    return ids


def wait_for(
    condition: Callable[[], bool], timeout: float, *, interval: float = 0.05, what: str = ""
) -> None:
    """Poll ``condition`` until it holds; raise TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what or condition}")
        time.sleep(interval)


@dataclass(frozen=True)
class Outcome:
    """What the jobs table says at the end of a durability run."""

    jobs: int
    succeeded: int
    failed_attempts: int
    jobs_with_expired_lease: int
    last_finished_at: datetime | None

    @property
    def lost(self) -> int:
        """Jobs that did not succeed (still queued or running, dead, or cancelled)."""
        return self.jobs - self.succeeded


def outcome(jobs: list[Job]) -> Outcome:
    """Summarize ``jobs``. Every attempt that did not end in success was recorded as a
    failed one (by the worker, or by the reaper when its lease expired)."""
    succeeded = [job for job in jobs if job.state is JobState.SUCCEEDED]
    finished_at = [job.finished_at for job in jobs if job.finished_at is not None]
    return Outcome(
        jobs=len(jobs),
        succeeded=len(succeeded),
        failed_attempts=sum(job.attempts for job in jobs) - len(succeeded),
        # A job that succeeded after its lease expired keeps that in its error history;
        # last_error is cleared by the success.
        jobs_with_expired_lease=sum(
            1
            for job in jobs
            if any(entry["error"].startswith("lease expired") for entry in job.errors)
        ),
        last_finished_at=max(finished_at) if finished_at else None,
    )


@dataclass(frozen=True)
class Evidence:
    """What a run of recording jobs left behind: the jobs table's outcome, the delivery
    rows, and the handler invocations the workers logged to local files."""

    outcome: Outcome
    deliveries: DeliverySummary
    handler_invocations: int

    def figures(self) -> dict[str, int]:
        """The figures the crash and restart drivers report, by their names in the
        results files."""
        final, summary = self.outcome, self.deliveries
        return {
            "jobs": final.jobs,
            "jobs_succeeded": final.succeeded,
            "jobs_lost": final.lost,
            "jobs_never_delivered": final.jobs - summary.jobs_delivered,
            "duplicate_deliveries": summary.duplicate_deliveries,
            "most_deliveries_of_one_job": summary.most_deliveries_of_one_job,
            "failed_attempts_recorded": final.failed_attempts,
            "jobs_with_expired_lease": final.jobs_with_expired_lease,
            "delivery_rows": summary.delivery_rows,
            "handler_invocations": self.handler_invocations,
        }


def evidence(queue: Queue, url: str, schema: str, log_dir: Path) -> Evidence:
    """The evidence of a finished run in ``schema``, whose workers logged to ``log_dir``
    (read it before the run's schema is dropped)."""
    return Evidence(
        outcome=outcome(all_jobs(queue)),
        deliveries=deliveries.summarize(url, schema),
        handler_invocations=deliveries.count_invocations(log_dir),
    )
