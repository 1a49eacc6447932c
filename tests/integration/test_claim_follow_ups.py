"""After a claim's statement commits, the statements that may follow it in the same call
(a second claim for a queue that just got settings, the failure of attempts whose
payload Python cannot load) can fail: the jobs the claim took still reach the caller,
and the acks that rode with it are settled, never resubmitted as lost leases."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Job, JobState, LifecycleHooks, Queue, WorkerProtocol, hookimpl
from pgqueue.plugins import get_plugin_manager

pytestmark = pytest.mark.timeout(120)


class Successes:
    """Records each on_success it is called with."""

    def __init__(self) -> None:
        self.job_ids: list[int] = []

    @hookimpl
    def on_success(self, job: Job, result: Any) -> None:
        self.job_ids.append(job.id)


def hooked(queue: Queue, plugin: object) -> Queue:
    pm = get_plugin_manager(load_entrypoints=False)
    pm.unregister(name="pgqueue.lifecycle_log")
    pm.register(plugin)
    return Queue(queue.pool, schema=queue.schema, hooks=LifecycleHooks(pm))


def refuse(db: psycopg.Connection, schema: str, condition: str) -> None:
    """Make PostgreSQL refuse, by a trigger, every change of a job row for which
    ``condition`` (on OLD and NEW) holds: a statement that fails inside the database."""
    db.execute(
        sql.SQL(
            """CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF {condition} THEN RAISE EXCEPTION 'refused by the test'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse BEFORE UPDATE ON {schema}.active_jobs
                FOR EACH ROW EXECUTE FUNCTION {schema}.refuse();"""
        ).format(schema=sql.Identifier(schema), condition=sql.SQL(condition))
    )


def allow(db: psycopg.Connection, schema: str) -> None:
    db.execute(sql.SQL("DROP TRIGGER refuse ON {}.active_jobs").format(sql.Identifier(schema)))


def a_queue_that_just_got_settings(queue: Queue, protocol: WorkerProtocol) -> tuple[list[int], int]:
    """Jobs in queue ``default`` and one in ``limited``, claimed together by
    ``protocol``, whose last claim found neither queue with settings; ``limited`` has
    settings since. The next claim is sent plain, takes nothing from ``limited``, and
    claims again with the limited statement. Returns the ids of both queues' jobs."""
    assert protocol.claim(["default", "limited"], ["t"]) == []
    plain = [queue.enqueue("t", {"n": n}).job.id for n in range(2)]
    limited = queue.enqueue("t", {"n": 9}, queue="limited").job.id
    queue.update_queue("limited", concurrency_limit=5)
    return plain, limited


def test_a_claim_whose_second_claim_fails_hands_over_the_jobs_the_first_took(
    queue: Queue, db, schema: str
):
    protocol = WorkerProtocol(queue)
    plain, limited = a_queue_that_just_got_settings(queue, protocol)
    refuse(db, schema, "OLD.queue = 'limited' AND NEW.state = 'running'")

    claimed = protocol.claim(["default", "limited"], ["t"], limit=5)

    assert [job.id for job in claimed] == plain
    running = queue.list(state="running").jobs
    assert {job.id: job.lease_token for job in running} == {
        job.id: job.lease_token for job in claimed
    }
    assert queue.get(limited).state is JobState.QUEUED
    # The next claim takes the limited queue's job as soon as it can.
    allow(db, schema)
    assert [job.id for job in protocol.claim(["default", "limited"], ["t"], limit=5)] == [limited]


def test_acks_that_rode_with_a_claim_whose_second_claim_fails_are_settled(
    queue: Queue, db, schema: str
):
    successes = Successes()
    protocol = WorkerProtocol(hooked(queue, successes))
    acked_job = queue.enqueue("t", {"n": 0}).job
    [running] = protocol.claim(["default"], ["t"])
    plain, _ = a_queue_that_just_got_settings(queue, protocol)
    refuse(db, schema, "OLD.queue = 'limited' AND NEW.state = 'running'")

    acked = protocol.ack_and_claim([(running, {"ok": 1})], ["default", "limited"], ["t"], limit=5)

    assert [job.id for job in acked.jobs] == plain
    batch = acked.settle()
    assert [job.id for job in batch.succeeded] == [acked_job.id] and batch.lost == []
    assert successes.job_ids == [acked_job.id]
    assert queue.get(acked_job.id).result == {"ok": 1}


def test_when_a_claim_after_an_unstorable_result_fails_neither_is_written(
    queue: Queue, db, schema: str
):
    """A result that cannot be stored fails its attempt, whose dependents may need
    cancelling before the commit: that batch and the claim share one transaction, so a
    claim that fails leaves the lease with the caller, to write the outcome again."""
    protocol = WorkerProtocol(queue)
    first = queue.enqueue("t", {"n": 1}).job
    second = queue.enqueue("t", {"n": 2}).job
    [running] = protocol.claim(["default"], ["t"])
    refuse(db, schema, "OLD.state = 'queued' AND NEW.state = 'running'")

    with pytest.raises(psycopg.Error, match="refused by the test"):
        protocol.ack_and_claim([(running, float("nan"))], ["default"], ["t"])

    stored = queue.get(first.id)
    assert (stored.state, stored.lease_token) == (JobState.RUNNING, running.lease_token)
    allow(db, schema)
    acked = protocol.ack_and_claim([(running, float("nan"))], ["default"], ["t"])
    assert [job.id for job in acked.jobs] == [second.id]
    [failed] = acked.settle().failed
    assert failed.id == first.id and "result could not be stored" in failed.last_error


def test_a_claim_that_cannot_fail_a_poison_job_hands_over_the_others_and_fails_it_later(
    queue: Queue, db, schema: str
):
    protocol = WorkerProtocol(queue)
    first = queue.enqueue("t", {"n": 1}).job
    poison = db.execute(
        sql.SQL(
            "INSERT INTO {}.active_jobs (queue, task, payload) "
            """VALUES ('default', 'poison', '{{"n": 1e5000}}') RETURNING id"""
        ).format(sql.Identifier(schema))
    ).fetchone()[0]
    last = queue.enqueue("t", {"n": 2}).job
    # Writing the poison job's failed attempt fails.
    refuse(db, schema, "OLD.task = 'poison' AND OLD.state = 'running'")

    claimed = protocol.claim(["default"], ["t", "poison"], limit=5)

    assert [job.id for job in claimed] == [first.id, last.id]
    assert queue.get(poison).state is JobState.RUNNING
    # The claimer still holds its lease, and writes the failure with its next claim.
    allow(db, schema)
    assert protocol.claim(["default"], ["t", "poison"], limit=5) == []
    stored = queue.get(poison)
    assert (stored.state, stored.attempts) == (JobState.QUEUED, 1)
    assert stored.last_error.startswith("payload could not be decoded: a number with more")
