"""Flow control's rules: jobs with partition keys, a queue's partition concurrency
limit, and throttles (a handler's, of scope job, partition or queue, and an
operator's), on a queue of their own (FLOW_QUEUE) that is claimed on its own.

Every claim of that queue must take exactly the jobs the model's claim order says
(queue_model.QueueModel.claimable); besides, checked against the database at each
claim, no key runs more jobs than its limit and nothing is claimed of a key or a queue
whose throttle has not ended.

Throttles last an hour, until the test ends them all at once (time passing), with the
jobs they put back.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from machine import STATISTICS, WORKERS
from psycopg import sql
from queue_model import FLOW_QUEUE, PARTITIONS, TASK

from pgqueue import JobSpec, Throttle

THROTTLE_SECONDS = 3600.0


class FlowRules:
    """Keyed enqueues, partition limits, claims of the keyed queue, and throttles."""

    @rule(
        jobs=st.lists(
            st.tuples(st.none() | st.sampled_from(PARTITIONS), st.integers(-1, 1)),
            min_size=1,
            max_size=4,
        )
    )
    def enqueue_with_partition_keys(self, jobs: list[tuple[str | None, int]]) -> None:
        """One batch, each job with its key (or none) and its priority."""
        self._step()
        specs = [
            JobSpec(TASK, {"n": n}, queue=FLOW_QUEUE, partition_key=key, priority=priority)
            for n, (key, priority) in enumerate(jobs)
        ]
        results = self.queue.enqueue_many(specs)
        for (key, _), result in zip(jobs, results, strict=True):
            assert result.created and result.job.partition_key == key
            self._add(result.job, False, None)

    @rule(limit=st.none() | st.integers(0, 2))
    def limit_partition_concurrency(self, limit: int | None) -> None:
        self._step()
        info = self.queue.update_queue(FLOW_QUEUE, partition_concurrency_limit=limit, create=True)
        assert info.partition_concurrency_limit == limit
        if limit is None:
            self.model.partition_limits.pop(FLOW_QUEUE, None)
        else:
            self.model.partition_limits[FLOW_QUEUE] = limit

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim_partitioned(self, worker: str, limit: int) -> None:
        self._step()
        self._claim_partitioned(worker, limit)

    def _claim_partitioned(self, worker: str, limit: int) -> None:
        """A claim of the keyed queue: exactly the model's, within every key's limit and
        no throttled key's or queue's job; the queue's turn moves to the last key it
        served in claim order."""
        in_order = self._expected_in_order(limit)
        throttled = self._throttles_now()
        self._claim(self._protocol(), worker, FLOW_QUEUE, limit, [self.model])
        served = [job.partition for job in in_order if job.partition is not None]
        if served:
            self.model.turns[FLOW_QUEUE] = served[-1]
        taken = {job.id for job in in_order}
        keys, queue_throttled = throttled
        assert not (taken and queue_throttled), "a job of a throttled queue was claimed"
        claimed_keys = {job.partition for job in in_order} - {None}
        assert not claimed_keys & keys, f"jobs of throttled keys {claimed_keys & keys} claimed"
        limit_now = self.model.partition_limits.get(FLOW_QUEUE)
        if limit_now is not None and taken:
            for key, running in self._running_per_key().items():
                if key in claimed_keys:
                    assert running <= limit_now, (
                        f"key {key} runs {running} jobs, past its limit of {limit_now}"
                    )
        self._check_partitions()

    @rule()
    def work_partitioned(self) -> None:
        """A busy worker of the keyed queue: it acks every job of that queue it holds,
        then claims up to three (the rule Hypothesis draws most often, so that keys
        fill up to their limits and the turn goes round)."""
        self._step()
        worker = WORKERS[0]
        for holding in list(self.model.holdings[worker]):
            if self.model.jobs.get(holding.job_id) is None:
                continue
            if self.model.jobs[holding.job_id].queue != FLOW_QUEUE:
                continue
            self._finish(self._protocol(), worker, holding, True, [self.model])
        self._claim_partitioned(worker, 3)

    @precondition(
        lambda self: any(
            self.model.current(h) and self.model.jobs[h.job_id].queue == FLOW_QUEUE
            for hs in self.model.holdings.values()
            for h in hs
        )
    )
    @rule(pick=st.integers(0, 1000), scope=st.sampled_from(["job", "partition", "queue"]))
    def handler_throttles(self, pick: int, scope: str) -> None:
        """A handler of a job of the keyed queue raises Throttle: the job goes back,
        snoozed, its attempt given back; its key or its queue is held back too (a job
        without a key throttled by "partition" waits alone, as with "job")."""
        self._step()
        held = [
            (w, h)
            for w, hs in self.model.holdings.items()
            for h in hs
            if self.model.current(h) and self.model.jobs[h.job_id].queue == FLOW_QUEUE
        ]
        worker, holding = held[pick % len(held)]
        job = self.model.jobs[holding.job_id]
        written = self._protocol().throttle_many(
            [(holding.claimed, Throttle(THROTTLE_SECONDS, scope))]
        )
        assert written == [job.id]
        self.model.holdings[worker].remove(holding)
        job.state, job.token, job.expired = "queued", None, False
        job.attempts -= 1
        job.snoozed = True
        if scope == "partition" and job.partition is not None:
            self.model.throttled_keys.add((FLOW_QUEUE, job.partition))
        elif scope == "queue":
            self.model.throttled_queues.add(FLOW_QUEUE)
        [(state, attempts)] = self.execute(
            sql.SQL("SELECT state::text, attempts FROM {} WHERE id = %s").format(
                self.table("active_jobs")
            ),
            (job.id,),
        )
        assert (state, attempts) == ("queued", job.attempts)

    @precondition(
        lambda self: any(
            not self.model.current(h) and h.job_id in self.model.jobs
            for hs in self.model.holdings.values()
            for h in hs
        )
    )
    @rule(pick=st.integers(0, 1000))
    def stale_handler_throttles(self, pick: int) -> None:
        """A throttle from an attempt whose lease was lost writes nothing."""
        self._step()
        held = [
            (w, h)
            for w, hs in self.model.holdings.items()
            for h in hs
            if not self.model.current(h) and h.job_id in self.model.jobs
        ]
        worker, holding = held[pick % len(held)]
        self.model.holdings[worker].remove(holding)
        written = self._protocol().throttle_many(
            [(holding.claimed, Throttle(THROTTLE_SECONDS, "partition"))]
        )
        assert written == []

    @rule(key=st.none() | st.sampled_from(PARTITIONS))
    def operator_throttles(self, key: str | None) -> None:
        """``Queue.throttle`` of the keyed queue, or of one of its keys."""
        self._step()
        self.queue.throttle(FLOW_QUEUE, THROTTLE_SECONDS, partition_key=key)
        if key is None:
            self.model.throttled_queues.add(FLOW_QUEUE)
        else:
            self.model.throttled_keys.add((FLOW_QUEUE, key))

    @precondition(
        lambda self: (
            self.model.throttled_queues
            or self.model.throttled_keys
            or any(j.snoozed for j in self.model.jobs.values())
        )
    )
    @rule()
    def throttles_end(self) -> None:
        """Time passing: every throttle ends, and the jobs they put back are due."""
        self._step()
        self.execute(
            sql.SQL(
                "UPDATE {} SET throttled_until = now() - interval '1 second'"
                " WHERE throttled_until IS NOT NULL"
            ).format(self.table("queue_settings"))
        )
        self.execute(
            sql.SQL(
                "UPDATE {} SET throttled_until = now() - interval '1 second'"
                " WHERE throttled_until IS NOT NULL"
            ).format(self.table("partition_controls"))
        )
        snoozed = sorted(i for i, j in self.model.jobs.items() if j.snoozed)
        self.execute(
            sql.SQL(
                "UPDATE {} SET run_at = now() - interval '1 second'"
                " WHERE id = ANY(%s) AND state = 'queued'"
            ).format(self.table("active_jobs")),
            (snoozed,),
        )
        for job_id in snoozed:
            self.model.jobs[job_id].snoozed = False
        self.model.throttled_queues.clear()
        self.model.throttled_keys.clear()

    def _check_partitions(self) -> None:
        """``Queue.partitions`` lists each key's queued and running jobs and whether a
        throttle holds it, as the model says."""
        page = self.queue.partitions(FLOW_QUEUE, limit=1000)
        assert page.next_after is None
        listed = {
            p.partition_key: (p.queued, p.running, p.throttled_until is not None)
            for p in page.partitions
        }
        for key in PARTITIONS:
            jobs = [
                j for j in self.model.jobs.values() if j.queue == FLOW_QUEUE and j.partition == key
            ]
            queued = sum(1 for j in jobs if j.state == "queued")
            running = sum(1 for j in jobs if j.state == "running")
            throttled = (FLOW_QUEUE, key) in self.model.throttled_keys
            if queued or running or throttled:
                assert listed.get(key) == (queued, running, throttled), key

    @invariant()
    def the_throttles_are_the_models(self) -> None:
        """The throttles in force are the ones the model says."""
        STATISTICS.invariant_checks += 1
        keys, queue_throttled = self._throttles_now()
        assert keys == {k for q, k in self.model.throttled_keys if q == FLOW_QUEUE}
        assert queue_throttled == (FLOW_QUEUE in self.model.throttled_queues)

    # -- helpers --------------------------------------------------------------------

    def _expected_in_order(self, limit: int) -> list:
        """The jobs the next claim of ``limit`` must take, in claim order (run_at read
        from the database first, as _expected_claim does)."""
        self._expected_claim([FLOW_QUEUE], limit, [self.model])
        return self.model.claimable(FLOW_QUEUE, limit)

    def _throttles_now(self) -> tuple[set[str], bool]:
        """The keyed queue's throttled keys, and whether the queue is throttled, now."""
        keys = self.execute(
            sql.SQL(
                "SELECT partition_key FROM {} WHERE queue = %s AND throttled_until > now()"
            ).format(self.table("partition_controls")),
            (FLOW_QUEUE,),
        )
        queue = self.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE queue = %s AND throttled_until > now()").format(
                self.table("queue_settings")
            ),
            (FLOW_QUEUE,),
        )
        return {row[0] for row in keys}, queue[0][0] > 0

    def _running_per_key(self) -> dict[str, int]:
        rows = self.execute(
            sql.SQL(
                "SELECT partition_key, count(*) FROM {} WHERE queue = %s AND state = 'running'"
                " AND partition_key IS NOT NULL GROUP BY 1"
            ).format(self.table("active_jobs")),
            (FLOW_QUEUE,),
        )
        return dict(rows)
