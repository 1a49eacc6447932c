"""The operator's rules: cancels and retries, queue settings, pruning (by hand, and by
retention across the history's day partitions) and reading jobs back."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from machine import KEYS
from psycopg import sql
from queue_model import FINISHED, PAST_DAYS, QUEUES

from pgqueue import (
    DependenciesFailed,
    InvalidTransition,
    JobState,
    QueueNotFound,
    UniqueKeyHeld,
    history,
)
from pgqueue.queue_control import RATE_LIMIT_MAX

RATES = {
    # A bucket that would take 1,000 s to hold one job: no claim gets one in an example.
    "starving": 0.001,
    # Refilled by a thousand jobs a millisecond: never what limits a claim.
    "unlimited": RATE_LIMIT_MAX,
}


class OperatingRules:
    """What an operator does to jobs and queues, and what a reader sees."""

    # A job whose payload Python cannot read is cancelled like any other.
    @precondition(lambda self: self.model.jobs)
    @rule(pick=st.integers(0, 1000), any_job=st.booleans())
    def cancel(self, pick: int, any_job: bool) -> None:
        """Cancel a job that has not finished (or, with ``any_job``, any job)."""
        self._step()
        job = self._pick(pick, None if any_job else ("waiting", "queued", "running"))
        if job.state in FINISHED:
            with pytest.raises(InvalidTransition):
                self.queue.cancel(job.id)
            return
        assert self.queue.cancel(job.id).state.value == "cancelled"
        # Its waiting dependents are cancelled too, and theirs in turn.
        self.model.finished(job.id, "cancelled")

    @precondition(lambda self: self.model.jobs)
    @rule(pick=st.integers(0, 1000), any_job=st.booleans())
    def retry(self, pick: int, any_job: bool) -> None:
        """Retry a dead or cancelled job (or, with ``any_job``, any job: refused unless
        it is dead or cancelled, a waiting one too). A retried job waits for its
        dependencies that have not succeeded."""
        self._step()
        job = self._pick(pick, None if any_job else ("dead", "cancelled"))
        if job.state not in ("dead", "cancelled"):
            with pytest.raises(InvalidTransition):
                self.queue.retry(job.id)
            return
        holder = None if job.unique_key is None else self.model.unique_holder(job.unique_key)
        if holder is not None:
            with pytest.raises(UniqueKeyHeld, match=f"job {holder.id}"):
                self.queue.retry(job.id)
            return
        ended = {self.model.pruned_states.get(d) for d, j in self.model.edges if j == job.id}
        if ended & {"dead", "cancelled"}:
            # A dependency that did not succeed has been pruned: how it ended is gone
            # with it, and what a retry should then do is not settled. (One that
            # succeeded counts as met: the job must not wait for it forever.)
            return
        allowed = self.model.retry_outcomes(job.id)
        if not allowed:
            # A dependency ended dead or cancelled: refused, naming it, and the job
            # stays as it was.
            failed = self.model.failed_dependencies(job.id)
            with pytest.raises(DependenciesFailed) as refused:
                self.queue.retry(job.id)
            assert {i for i, _ in refused.value.failed} == failed, refused.value
            assert self.queue.get(job.id).state.value == job.state
            return
        retried = self.queue.retry(job.id)
        [(state, run_at)] = self.execute(
            sql.SQL("SELECT state::text, run_at FROM {} WHERE id = %s").format(self.table("jobs")),
            (job.id,),
        )
        unmet = sorted(self.model.unmet(job.id))
        assert retried.attempts == 0
        assert retried.state.value in allowed and state in allowed, (
            f"retried job {job.id} is {state} (the retry said {retried.state.value}), its "
            f"dependencies {unmet} not succeeded: it must be {' or '.join(allowed)}"
        )
        self.model.retried(job.id, run_at, state)

    @rule(queue=st.sampled_from(QUEUES), paused=st.booleans(), create=st.booleans())
    def pause_or_resume(self, queue: str, paused: bool, create: bool) -> None:
        """Without ``create``, only a queue that exists: one with settings, jobs in any
        state (waiting ones too), or finished jobs counted, even if pruned since."""
        self._step()
        known = (
            queue in self.configured
            or any(job.queue == queue for job in self.model.jobs.values())
            or queue in self.model.pruned_queues
        )
        if not (create or known):
            with pytest.raises(QueueNotFound):
                self.queue.update_queue(queue, paused=paused)
            return
        self.configured.add(queue)
        if paused:
            info = self.queue.pause_queue(queue, create=create)
            self.model.paused.add(queue)
        else:
            info = self.queue.update_queue(queue, paused=False, create=create)
            self.model.paused.discard(queue)
        assert info.paused is paused

    @rule(queue=st.sampled_from(QUEUES), limit=st.none() | st.integers(0, 2))
    def limit_concurrency(self, queue: str, limit: int | None) -> None:
        self._step()
        self.configured.add(queue)
        info = self.queue.update_queue(queue, concurrency_limit=limit, create=True)
        assert info.concurrency_limit == limit
        if limit is None:
            self.model.concurrency_limits.pop(queue, None)
        else:
            self.model.concurrency_limits[queue] = limit

    @rule(queue=st.sampled_from(QUEUES), rate=st.sampled_from([None, *sorted(RATES)]))
    def limit_rate(self, queue: str, rate: str | None) -> None:
        """A rate limit whose effect an example can predict: one that starves the queue,
        one that never limits it, or none."""
        self._step()
        self.configured.add(queue)
        jobs_per_second = None if rate is None else RATES[rate]
        info = self.queue.update_queue(queue, rate_limit=jobs_per_second, create=True)
        assert info.rate_limit == jobs_per_second
        if rate == "starving":
            self.model.starved.add(queue)
        else:
            self.model.starved.discard(queue)

    @rule(states=st.sets(st.sampled_from(FINISHED), min_size=1))
    def prune(self, states: set[str]) -> None:
        """Pruning by hand: every finished job of ``states``, from any partition."""
        self._step()
        gone = {j.id for j in self.model.jobs.values() if j.state in states}
        assert self.queue.prune(0, sorted(states)) == len(gone)
        self.model.pruned(gone)

    @precondition(
        lambda self: any(j.state in FINISHED and not j.age for j in self.model.jobs.values())
    )
    @rule(pick=st.integers(0, 1000), days=st.sampled_from([*PAST_DAYS, 9]))
    def age_history(self, pick: int, days: int) -> None:
        """Time passing for one finished job: its times move ``days`` back, so it moves
        to that day's partition (the example's first such move creates the partitions
        of PAST_DAYS, as a pruner running for days would have), or to its state's
        DEFAULT partition when that day has none."""
        self._step()
        if not self.same_day():
            return
        if not self.days_made:
            self.days_made = True
            with self.pool.connection() as conn:
                for state in FINISHED:
                    for back in PAST_DAYS:
                        day = history.Day(JobState(state), self.today - timedelta(days=back))
                        day.create(conn, self.schema)
                        conn.commit()
            self.model.past_days = {(state, back) for state in FINISHED for back in PAST_DAYS}
        finished = sorted(
            j.id for j in self.model.jobs.values() if j.state in FINISHED and not j.age
        )
        job = self.model.jobs[finished[pick % len(finished)]]
        [(partition, finished_at)] = self.execute(
            sql.SQL(
                "UPDATE {} SET enqueued_at = enqueued_at - %(back)s, run_at = run_at - %(back)s, "
                "started_at = started_at - %(back)s, finished_at = finished_at - %(back)s, "
                "errors = (SELECT jsonb_agg(jsonb_set(error, '{{failed_at}}', "
                "to_jsonb((error->>'failed_at')::timestamptz - %(back)s)) ORDER BY position) "
                "FROM jsonb_array_elements(errors) WITH ORDINALITY AS e (error, position)) "
                "WHERE id = %(id)s RETURNING tableoid::regclass::text, finished_at"
            ).format(self.table("finished_jobs")),
            {"back": timedelta(days=days), "id": job.id},
        )
        self.model.aged(job.id, days)
        where = "default" if job.in_default else f"p{finished_at.astimezone(UTC).date():%Y%m%d}"
        assert partition.endswith(f"finished_jobs_{job.state}_{where}"), partition

    @rule(
        retention=st.dictionaries(
            st.sampled_from(FINISHED), st.sampled_from([0, 1, 2, 10]), min_size=1
        )
    )
    def prune_expired(self, retention: dict[str, int]) -> None:
        """The automatic pruner's round with ``retention`` (days per state): past days
        dropped whole, and jobs from the DEFAULT partitions; today's are kept."""
        self._step()
        if not self.same_day():
            return
        gone, dropped = self.model.removed_by_retention(retention)
        removed = self.queue.prune_expired(
            {state: timedelta(days=days) for state, days in retention.items()}
        )
        assert removed == len(gone)
        self.model.pruned(gone)
        self.model.past_days -= dropped

    @precondition(lambda self: self.model.jobs or self.model.pruned_ids)
    @rule(pick=st.integers(0, 1000))
    def inspect_dependencies(self, pick: int) -> None:
        """Both directions, for a job or a pruned one (whose dependents keep its id)."""
        self._step()
        ids = sorted(set(self.model.jobs) | self.model.pruned_ids)
        job_id = ids[pick % len(ids)]
        found = self.queue.dependencies(job_id)
        assert (found.depends_on, found.dependents) == self.model.dependencies(job_id)

    # A job whose payload Python cannot read is read with the payload's text instead.
    @precondition(lambda self: self.model.jobs)
    @rule(pick=st.integers(0, 1000))
    def read_jobs(self, pick: int) -> None:
        """A job by id, every job page by page, and the jobs holding idempotency keys:
        each as the model says, a payload that cannot be decoded included."""
        self._step()
        job = self._pick(pick)
        found = self.queue.get(job.id)
        assert found.state.value == job.state
        if job.poison is None:
            assert isinstance(found.payload, dict)
        listed: list[int] = []
        after = None
        while True:
            page = self.queue.list(limit=100, after=after)
            listed += [found.id for found in page.jobs]
            if page.next_after is None:
                break
            after = page.next_after
        assert listed == sorted(self.model.jobs, reverse=True)
        for key in KEYS:
            holder = self.model.by_key(key)
            held = self.queue.get_by_idempotency_key(key)
            assert (held and held.id) == (holder and holder.id), key
