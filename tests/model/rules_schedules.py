"""The schedules' rules: declaring, switching and ticking periodic jobs.

Every schedule fires once a year (on 1 January), so none comes due by itself during an
example: the test makes one due by moving its next run to a past tick (time passing,
as expire_a_lease does for leases), then runs a scheduler round."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule
from psycopg import sql
from queue_model import QUEUES, TASK, ModelSchedule

from pgqueue.schedules import Schedule, ScheduleNotFound, tick_key
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS

SCHEDULES = ("s0", "s1")
CRON = "0 0 1 1 *"
SOURCE = "model"
TICKS = tuple(datetime(year, 1, 1, tzinfo=UTC) for year in (2020, 2021, 2022))


class ScheduleRules:
    """Schedules declared by a plugin (synced), switched by the operator, ticked by the
    scheduler: one job per tick, whose idempotency key is the schedule's name and tick."""

    @rule(
        name=st.sampled_from(SCHEDULES),
        queue=st.sampled_from(QUEUES),
        priority=st.integers(-2, 2),
        max_attempts=st.none() | st.integers(1, 3),
    )
    def define_schedule(
        self, name: str, queue: str, priority: int, max_attempts: int | None
    ) -> None:
        """The plugin's schedules synced, ``name`` (re)defined: the operator's switch
        stays as it was."""
        self._step()
        before = self.model.schedules.get(name)
        enabled = before.enabled if before is not None else True
        self.model.schedules[name] = ModelSchedule(queue, priority, max_attempts, enabled)
        declared = {
            each: Schedule(
                each,
                CRON,
                TASK,
                queue=schedule.queue,
                priority=schedule.priority,
                max_attempts=schedule.max_attempts,
                source=SOURCE,
            )
            for each, schedule in self.model.schedules.items()
        }
        self.queue.sync_schedules(declared, [SOURCE])
        infos = {info.name: info for info in self.queue.schedules()}
        assert {n: infos[n].enabled for n in infos} == {
            n: s.enabled for n, s in self.model.schedules.items()
        }

    @rule(name=st.sampled_from(SCHEDULES), enabled=st.booleans())
    def switch_schedule(self, name: str, enabled: bool) -> None:
        self._step()
        schedule = self.model.schedules.get(name)
        if schedule is None:
            with pytest.raises(ScheduleNotFound):
                self.queue.set_schedule_enabled(name, enabled)
            return
        info = self.queue.set_schedule_enabled(name, enabled)
        assert info.enabled is enabled
        schedule.enabled = enabled

    @rule(name=st.sampled_from(SCHEDULES), tick=st.sampled_from(TICKS))
    def schedule_tick(self, name: str, tick: datetime) -> None:
        """``name``'s tick ``tick`` comes due (if it is enabled), and a scheduler round
        runs: a job for that tick unless its key already has one (or names a job of
        another queue: then none), and the schedule moves on to a tick to come."""
        self._step()
        schedule = self.model.schedules.get(name)
        self.execute(
            sql.SQL("UPDATE {} SET next_run_at = %s WHERE name = %s AND enabled").format(
                self.table("schedules")
            ),
            (tick, name),
        )
        due = schedule is not None and schedule.enabled
        key = tick_key(name, tick)
        holder = self.model.by_key(key)
        ran = self.queue.run_due_schedules()
        assert ran.ran
        assert [(run.schedule, run.tick) for run in ran.runs] == ([(name, tick)] if due else [])
        if not due:
            return
        [run] = ran.runs
        assert schedule is not None
        if holder is not None:
            expected = holder.id if holder.queue == schedule.queue else None
            assert (run.job_id, run.created) == (expected, False)
        else:
            assert run.created and run.job_id is not None
            job = self.queue.get(run.job_id)
            assert (job.queue, job.priority, job.max_attempts, job.idempotency_key) == (
                schedule.queue,
                schedule.priority,
                schedule.max_attempts or DEFAULT_MAX_ATTEMPTS,
                key,
            )
            self._add(job, False, key)
        [info] = [info for info in self.queue.schedules() if info.name == name]
        assert info.next_run_at is not None and info.next_run_at > datetime.now(UTC)
