"""Retention: ``Queue.prune_expired`` and the worker's pruner service."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest
from polling import wait_for
from processes import environment, pgqueue_command, start_worker, stop
from scale_support import backdate, job_in_state, remaining_ids

from pgqueue import JobState, Queue, ValidationError
from pgqueue.locks import advisory_key
from pgqueue_worker.outage import DatabaseHealth
from pgqueue_worker.pruner import DAY, Pruner, Retention

WEEK = 7 * DAY
MONTH = 30 * DAY
HERE = Path(__file__).resolve().parent
DEFAULT_RULES = {JobState.SUCCEEDED: WEEK, JobState.CANCELLED: WEEK, JobState.DEAD: MONTH}


def finished_jobs(
    queue: Queue, db, schema: str, state: JobState, count: int, age: str
) -> list[int]:
    ids = [job_in_state(queue, state).id for _ in range(count)]
    backdate(db, schema, ids, age)
    return ids


def test_each_finished_state_is_pruned_after_its_own_retention(queue, db, schema):
    old_succeeded = finished_jobs(queue, db, schema, JobState.SUCCEEDED, 2, "8 days")
    recent_succeeded = finished_jobs(queue, db, schema, JobState.SUCCEEDED, 1, "6 days")
    old_cancelled = finished_jobs(queue, db, schema, JobState.CANCELLED, 1, "8 days")
    dead_kept = finished_jobs(queue, db, schema, JobState.DEAD, 1, "8 days")
    old_dead = finished_jobs(queue, db, schema, JobState.DEAD, 1, "31 days")
    unfinished = [job_in_state(queue, JobState.QUEUED).id, job_in_state(queue, JobState.RUNNING).id]

    deleted = queue.prune_expired(DEFAULT_RULES)

    assert deleted == len(old_succeeded + old_cancelled + old_dead)
    assert remaining_ids(queue) == set(recent_succeeded + dead_kept + unfinished)


def test_states_left_out_of_the_retention_are_kept_forever(queue, db, schema):
    dead = finished_jobs(queue, db, schema, JobState.DEAD, 1, "400 days")
    succeeded = finished_jobs(queue, db, schema, JobState.SUCCEEDED, 1, "400 days")
    assert queue.prune_expired({JobState.SUCCEEDED: WEEK}) == 1
    assert remaining_ids(queue) == set(dead)
    assert not set(succeeded) & remaining_ids(queue)


def test_pruning_goes_in_small_batches_and_a_round_stops_after_max_batches(queue, db, schema):
    ids = finished_jobs(queue, db, schema, JobState.SUCCEEDED, 7, "8 days")
    assert queue.prune_expired(DEFAULT_RULES, batch_size=2, max_batches=2) == 4
    assert len(remaining_ids(queue)) == 3
    assert queue.prune_expired(DEFAULT_RULES, batch_size=2) == 3
    assert not remaining_ids(queue) & set(ids)


def test_only_one_process_prunes_at_a_time(queue, db, schema, database_url):
    finished_jobs(queue, db, schema, JobState.SUCCEEDED, 3, "8 days")
    with psycopg.connect(database_url) as other:
        # Another pruner's batch, mid-transaction: it holds the schema's pruner lock.
        locked = other.execute(
            "SELECT pg_try_advisory_xact_lock(%s)", (advisory_key("prune", schema),)
        ).fetchone()[0]
        assert locked
        assert queue.prune_expired(DEFAULT_RULES) is None
        assert len(remaining_ids(queue)) == 3
        other.rollback()
    assert queue.prune_expired(DEFAULT_RULES) == 3


def test_the_pruner_lock_is_per_schema(queue, db, schema, database_url):
    finished_jobs(queue, db, schema, JobState.SUCCEEDED, 1, "8 days")
    with psycopg.connect(database_url) as other:
        other.execute(
            "SELECT pg_try_advisory_xact_lock(%s)", (advisory_key("prune", "another_schema"),)
        )
        assert queue.prune_expired(DEFAULT_RULES) == 1


def test_pruning_lowers_the_gauges_and_keeps_the_counters(queue, db, schema):
    finished_jobs(queue, db, schema, JobState.SUCCEEDED, 3, "8 days")
    before = {m.queue: m for m in queue.metrics_snapshot().queues}
    queue.prune_expired(DEFAULT_RULES)
    after = {m.queue: m for m in queue.metrics_snapshot().queues}
    assert sum(m.jobs["succeeded"] for m in before.values()) == 3
    assert sum(m.jobs["succeeded"] for m in after.values()) == 0
    assert (
        sum(m.completed for m in after.values()) == sum(m.completed for m in before.values()) == 3
    )


@pytest.mark.parametrize(
    ("retention", "batch_size", "message"),
    [
        ({"queued": WEEK}, 10, "only succeeded, dead and cancelled"),
        ({"running": WEEK}, 10, "only succeeded, dead and cancelled"),
        ({"exploded": WEEK}, 10, "not a job state"),
        ({"dead": -1}, 10, "must not be negative"),
        ({"dead": WEEK}, 0, "batch_size"),
    ],
)
def test_prune_expired_refuses_what_it_cannot_do(queue, retention, batch_size, message):
    with pytest.raises(ValidationError, match=message):
        queue.prune_expired(retention, batch_size=batch_size)


# -- the pruner service ------------------------------------------------------------------


def test_default_retention_keeps_dead_jobs_longer_than_the_rest():
    rules = Retention().rules()
    assert rules[JobState.DEAD] > rules[JobState.SUCCEEDED]
    assert rules[JobState.DEAD] > rules[JobState.CANCELLED]
    assert Retention().describe() == "succeeded after 7d, cancelled after 7d, dead after 30d"


def test_zero_keeps_a_state_forever_and_all_zero_turns_the_pruner_off(queue, db, schema):
    finished_jobs(queue, db, schema, JobState.SUCCEEDED, 1, "400 days")
    assert JobState.SUCCEEDED not in Retention(succeeded=0).rules()
    pruner = Pruner(queue, Retention(succeeded=0, cancelled=0, dead=0), health=DatabaseHealth())
    assert not pruner.enabled
    assert pruner.tick() is False
    assert len(remaining_ids(queue)) == 1


def test_a_pruner_round_deletes_expired_jobs_and_skips_while_another_prunes(
    queue, db, schema, database_url
):
    kept = finished_jobs(queue, db, schema, JobState.SUCCEEDED, 1, "1 hour")
    finished_jobs(queue, db, schema, JobState.SUCCEEDED, 2, "2 days")
    pruner = Pruner(queue, Retention(succeeded=DAY), health=DatabaseHealth(), batch_size=1)
    with psycopg.connect(database_url) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("prune", schema),))
        assert pruner.tick() is False
        other.rollback()
    assert pruner.tick() is True
    assert pruner.deleted == 2
    assert remaining_ids(queue) == set(kept)


def test_the_pruner_thread_prunes_in_the_background_until_stopped(queue, db, schema):
    finished_jobs(queue, db, schema, JobState.DEAD, 2, "31 days")
    pruner = Pruner(queue, Retention(), interval=0.1, health=DatabaseHealth())
    pruner.start()
    try:
        wait_for(lambda: not remaining_ids(queue), what="the pruner to delete the old dead jobs")
    finally:
        pruner.stop(timeout=10)
    assert pruner.deleted == 2


def test_a_pruner_needs_a_positive_interval(queue):
    with pytest.raises(ValidationError, match="prune_interval"):
        Pruner(queue, Retention(), interval=0, health=DatabaseHealth())


# -- the pruner in `pgqueue worker` -----------------------------------------------------


def _worker_args(database_url: str, schema: str, *flags: str) -> list[str]:
    return [
        "--database-url",
        database_url,
        "--schema",
        schema,
        "--no-plugin-autoload",
        "--handlers",
        "scale_handlers:HANDLERS",
        "--poll-interval",
        "0.2",
        *flags,
    ]


def test_pgqueue_worker_prunes_by_its_flags(queue, db, schema, database_url, tmp_path):
    old_succeeded = finished_jobs(queue, db, schema, JobState.SUCCEEDED, 2, "3 days")
    kept = finished_jobs(queue, db, schema, JobState.SUCCEEDED, 1, "10 minutes")
    kept += finished_jobs(queue, db, schema, JobState.DEAD, 1, "3 days")
    log_path = tmp_path / "worker.log"
    flags = ("--prune-succeeded-after", "1d", "--prune-dead-after", "7d", "--prune-interval", "0.2")
    worker = start_worker(_worker_args(database_url, schema, *flags), environment(HERE), log_path)
    try:
        wait_for(
            lambda: not remaining_ids(queue) & set(old_succeeded),
            what=f"the worker's pruner; log:\n{log_path.read_text()}",
        )
    finally:
        (exit_code,) = stop([worker])
    log = log_path.read_text()
    assert remaining_ids(queue) == set(kept)
    assert "succeeded after 1d, cancelled after 7d, dead after 7d" in log
    assert "pruned 2 finished jobs" in log
    assert exit_code == 0, log


def test_pgqueue_worker_refuses_a_retention_that_is_not_a_duration(database_url, schema):
    result = subprocess.run(
        [
            *pgqueue_command(),
            "worker",
            *_worker_args(database_url, schema, "--prune-dead-after", "soon"),
        ],
        env=environment(HERE),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "not a duration" in result.stderr
