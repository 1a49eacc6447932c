"""What must hold after every step, read from the database and compared with the model."""

from __future__ import annotations

from hypothesis.stateful import invariant
from machine import APPLICATION_TABLE, STATISTICS
from psycopg import sql
from queue_model import FINISHED, QUEUES, STATES


class Invariants:
    """Every job as the model says, in exactly one table, none lost or duplicated; the
    dependency edges and the queues' counts as the model says; nothing queued or running
    before its dependencies succeeded; timestamps in the order of the events; a handler's
    side effects exactly once."""

    @invariant()
    def every_job_is_what_the_model_says(self) -> None:
        STATISTICS.invariant_checks += 1
        rows = self.execute(
            sql.SQL(
                "SELECT id, state::text, attempts, lease_token, last_error, "
                "lease_expires_at < now(), 'active' FROM {active} UNION ALL "
                "SELECT id, state::text, attempts, lease_token, last_error, NULL, 'finished' "
                "FROM {finished}"
            ).format(active=self.table("active_jobs"), finished=self.table("finished_jobs"))
        )
        ids = [row[0] for row in rows]
        assert len(ids) == len(set(ids)), "a job is in both tables, or twice in one"
        assert set(ids) == set(self.model.jobs), "a job appeared or disappeared"
        for job_id, state, attempts, token, last_error, lapsed, table in rows:
            expected = self.model.jobs[job_id]
            assert (state, attempts) == (expected.state, expected.attempts), job_id
            assert table == ("finished" if state in FINISHED else "active")
            if state == "running":
                assert token == expected.token
                assert lapsed == expected.expired, (
                    f"job {job_id}'s lease {'expired' if lapsed else 'is held'}; "
                    f"the model says {'expired' if expected.expired else 'held'}"
                )
            if state == "cancelled" and expected.reason is not None:
                assert last_error == expected.reason, job_id

    @invariant()
    def the_dependencies_are_the_models(self) -> None:
        STATISTICS.invariant_checks += 1
        edges = self.execute(
            sql.SQL("SELECT depends_on, job_id FROM {}").format(self.table("job_dependencies"))
        )
        assert set(edges) == self.model.edges

    @invariant()
    def the_counts_are_the_models(self) -> None:
        STATISTICS.invariant_checks += 1
        reported = {stats.queue: stats.counts for stats in self.queue.stats()}
        for queue in QUEUES:
            counts = reported.get(queue, dict.fromkeys(STATES, 0))
            assert {s: counts.get(s, 0) for s in STATES} == self.model.counts(queue), queue

    @invariant()
    def nothing_runs_before_its_dependencies_succeeded(self) -> None:
        """No queued or running job has a dependency that has not succeeded (a pruned
        dependency counts as what it ended as)."""
        STATISTICS.invariant_checks += 1
        rows = self.execute(
            sql.SQL(
                "SELECT job.id, job.state::text, dependency.depends_on, ended.state::text "
                "FROM {active} AS job "
                "JOIN {dependencies} AS dependency ON dependency.job_id = job.id "
                "LEFT JOIN {jobs} AS ended ON ended.id = dependency.depends_on "
                "WHERE job.state IN ('queued', 'running')"
            ).format(
                active=self.table("active_jobs"),
                dependencies=self.table("job_dependencies"),
                jobs=self.table("jobs"),
            )
        )
        for job_id, state, dependency, dependency_state in rows:
            ended = dependency_state or self.model.pruned_states.get(dependency)
            assert ended == "succeeded", (
                f"job {job_id} is {state} while its dependency {dependency} is {ended}"
            )

    @invariant()
    def timestamps_are_ordered_as_events(self) -> None:
        """A job's enqueued_at <= started_at <= finished_at, its failed attempts' times
        in order between them; a dependent starts no earlier than each of its
        dependencies finished."""
        STATISTICS.invariant_checks += 1
        rows = self.execute(
            sql.SQL(
                "SELECT id, enqueued_at, started_at, finished_at, ARRAY("
                "SELECT (error->>'failed_at')::timestamptz "
                "FROM jsonb_array_elements(coalesce(errors, '[]')) WITH ORDINALITY "
                "AS e (error, position) ORDER BY position) FROM {}"
            ).format(self.table("jobs"))
        )
        for job_id, enqueued_at, started_at, finished_at, failed_at in rows:
            events = [enqueued_at, started_at, *failed_at, finished_at]
            # started_at is the last attempt's start, which may follow earlier failures.
            ordered = [enqueued_at, *failed_at, finished_at]
            for times in (ordered, [enqueued_at, started_at, finished_at]):
                times = [t for t in times if t is not None]
                assert times == sorted(times), (job_id, events)
        pairs = self.execute(
            sql.SQL(
                "SELECT job.id, job.started_at, dependency.id, dependency.finished_at "
                "FROM {edges} AS edge JOIN {jobs} AS job ON job.id = edge.job_id "
                "JOIN {jobs} AS dependency ON dependency.id = edge.depends_on "
                "WHERE job.started_at IS NOT NULL"
            ).format(edges=self.table("job_dependencies"), jobs=self.table("jobs"))
        )
        for job_id, started_at, dependency, finished_at in pairs:
            if self.model.jobs[job_id].shifted:
                continue  # its times moved back by age_history, not by events
            assert finished_at is not None and started_at >= finished_at, (
                f"job {job_id} started at {started_at}, before its dependency {dependency} "
                f"finished ({finished_at})"
            )

    @invariant()
    def the_application_rows_are_the_committed_completions(self) -> None:
        """The application table (rules_effects.py) holds one row per job whose
        ``job.complete`` committed, written by the attempt that completed it, and none
        for any other job: no row of a transaction that met LeaseLost, or rolled back,
        ever commits. Each of those jobs succeeded (if pruned since, it had)."""
        STATISTICS.invariant_checks += 1
        rows = self.execute(
            sql.SQL("SELECT job_id, token FROM {} ORDER BY job_id").format(
                self.table(APPLICATION_TABLE)
            )
        )
        job_ids = [job_id for job_id, _ in rows]
        twice = sorted({job_id for job_id in job_ids if job_ids.count(job_id) > 1})
        assert not twice, f"jobs with more than one application row: {twice}"
        assert dict(rows) == self.completed_in_transaction, (
            f"application rows {dict(rows)}; the committed completions "
            f"{self.completed_in_transaction}"
        )
        for job_id in job_ids:
            assert self.model.state_of(job_id) == "succeeded", job_id
