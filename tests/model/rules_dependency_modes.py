"""Callbacks when a group finishes: enqueues with ``dependency_mode="finished"``, and
what must hold of them after every step.

A dependent in "finished" mode waits for each dependency to be final in any state
(succeeded, dead or cancelled), is queued by whichever end (ack, death, cancel) is the
last, and is never cancelled by them; the other rules (failures, cancels, retries,
pruning) then drive its dependencies, and the model (queue_model.py) says when it must
be released. A dependency retried while it still waits is waited for again."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from machine import STATISTICS
from psycopg import sql
from queue_model import FINISHED, QUEUES, TASK, ModelJob

from pgqueue import BatchItem, Job, JobSpec


class DependencyModeRules:
    """Rules and invariants of ``dependency_mode="finished"``."""

    @rule(
        queue=st.sampled_from(QUEUES),
        picks=st.lists(st.integers(0, 1000), min_size=1, max_size=5),
        max_attempts=st.integers(1, 2),
    )
    def enqueue_callback(self, queue: str, picks: list[int], max_attempts: int) -> None:
        """A callback over known jobs in any state (already final ones count as met)."""
        self._step()
        depends_on = self._dependencies(picks, None)
        if not depends_on:
            return
        expected = self.model.expected_state(set(depends_on), finished_mode=True)
        outcome = self.queue.enqueue(
            TASK,
            {},
            queue=queue,
            max_attempts=max_attempts,
            depends_on=depends_on,
            dependency_mode="finished",
        )
        assert outcome.created and outcome.job.state.value == expected
        self._add_in_mode(outcome.job, set(depends_on), finished_mode=True)

    @rule(
        queue=st.sampled_from(QUEUES),
        size=st.integers(1, 4),
        dying=st.integers(0, 4),
        picks=st.lists(st.integers(0, 1000), max_size=2),
        strict_too=st.booleans(),
    )
    def enqueue_group_with_callback(
        self, queue: str, size: int, dying: int, picks: list[int], strict_too: bool
    ) -> None:
        """A batch: ``size`` jobs (the first ``dying`` of them with one attempt), a
        callback in "finished" mode over all of them and over jobs enqueued before, and
        with ``strict_too`` a dependent in the default mode over the same."""
        self._step()
        earlier = self._dependencies(picks, None)
        specs = [
            JobSpec(TASK, {"n": n}, queue=queue, max_attempts=1 if n < dying else 3)
            for n in range(size)
        ]
        group: list[int | BatchItem] = [BatchItem(n) for n in range(size)]
        specs.append(
            JobSpec(TASK, queue=queue, depends_on=group + earlier, dependency_mode="finished")
        )
        if strict_too:
            specs.append(JobSpec(TASK, queue=queue, depends_on=group + earlier))
        results = self.queue.enqueue_many(specs)
        assert all(result.created for result in results)
        for spec, result in zip(specs, results, strict=True):
            resolved = {
                results[d.index].job.id if isinstance(d, BatchItem) else d for d in spec.depends_on
            }
            finished_mode = spec.dependency_mode == "finished"
            expected = self.model.expected_state(resolved, finished_mode=finished_mode)
            assert result.job.state.value == expected, (spec, result.job)
            self._add_in_mode(result.job, resolved, finished_mode=finished_mode)

    def _add_in_mode(self, job: Job, depends_on: set[int], *, finished_mode: bool) -> None:
        created = ModelJob(
            id=job.id,
            queue=job.queue,
            priority=job.priority,
            max_attempts=job.max_attempts,
            run_at=job.run_at,
            delayed=False,
            key=None,
            finished_mode=finished_mode,
        )
        self.model.enqueued(created, depends_on)

    @invariant()
    def the_dependency_modes_are_the_models(self) -> None:
        STATISTICS.invariant_checks += 1
        rows = self.execute(
            sql.SQL("SELECT DISTINCT job_id FROM {} WHERE finished_mode").format(
                self.table("job_dependencies")
            )
        )
        expected = {j for _, j in self.model.edges if self.model.jobs[j].finished_mode}
        assert {row[0] for row in rows} == expected

    @invariant()
    def a_finished_mode_job_runs_only_once_its_dependencies_are_final(self) -> None:
        """Queued or running only once every dependency is final (or was retried after
        it was counted), and never cancelled by one."""
        STATISTICS.invariant_checks += 1
        rows = self.execute(
            sql.SQL(
                "SELECT job.id, job.state::text, job.last_error, link.depends_on, "
                "dependency.state::text "
                "FROM {jobs} AS job "
                "JOIN {links} AS link ON link.job_id = job.id AND link.finished_mode "
                "LEFT JOIN {jobs} AS dependency ON dependency.id = link.depends_on"
            ).format(jobs=self.table("jobs"), links=self.table("job_dependencies"))
        )
        for job_id, state, last_error, dependency, dependency_state in rows:
            ended = dependency_state or self.model.pruned_states.get(dependency)
            if state in ("queued", "running") and dependency not in self.model.revived:
                assert ended in FINISHED, (
                    f"job {job_id} (finished mode) is {state} while its dependency "
                    f"{dependency} is {ended}"
                )
            if state == "cancelled":
                assert not (last_error or "").startswith("dependency "), (
                    f"job {job_id} (finished mode) was cancelled by a dependency: {last_error}"
                )
