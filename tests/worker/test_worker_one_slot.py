"""A worker with nothing running sends its finished jobs' acks with its next claim, in
one transaction: one commit per job where two would do the same work. Its hooks still
run for every job, and a failure still goes through the outcome writer."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest
from test_worker_hook_timing import Events, hooked

from pgqueue import Job, JobSpec, JobState, Queue, hookimpl

pytestmark = pytest.mark.slow


class Recorder:
    def __init__(self) -> None:
        self.events = Events()

    @hookimpl
    def on_success(self, job: Job, result: Any) -> None:
        self.events.add("success", job)

    @hookimpl
    def on_fail(self, job: Job, error: str, next_run_at: Any) -> None:
        self.events.add("fail", job)


def test_each_ack_commits_with_the_next_claim(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    recorder = Recorder()
    _record_transactions(db, schema)
    specs = [JobSpec("t", {"n": n}, max_attempts=1 if n == 10 else 5) for n in range(30)]
    jobs = [result.job for result in queue.enqueue_many(specs)]

    def handler(payload: dict[str, Any]) -> dict[str, int]:
        if payload["n"] == 10:
            raise RuntimeError("the eleventh job fails")
        return {"n": payload["n"]}

    worker = run_worker(
        {"t": handler}, on=hooked(queue, recorder), concurrency=1, prefetch=0, burst=True
    )
    worker.thread.join(120)
    assert not worker.thread.is_alive() and worker.clean is True

    rows = db.execute(
        f'SELECT id, state, attempts, started_at, finished_at FROM "{schema}".jobs ORDER BY id'
    ).fetchall()
    assert [row[0] for row in rows] == [job.id for job in jobs]
    assert [(row[1], row[2]) for row in rows] == [
        ("dead" if n == 10 else "succeeded", 1) for n in range(30)
    ]
    # A success's ack and the claim of the next job share a transaction, in which the
    # ack comes first; the failure went through the outcome writer, in a transaction of
    # its own, which may commit after the next claim.
    xacts = dict(
        ((job_id, event), xact)
        for job_id, event, xact in db.execute(f'SELECT * FROM "{schema}".xacts').fetchall()
    )
    apart = [
        n
        for n, (before, after) in enumerate(itertools.pairwise(rows))
        if xacts[before[0], "finished"] != xacts[after[0], "claimed"]
    ]
    assert apart == [10]
    assert all(
        before[4] <= after[3]
        for n, (before, after) in enumerate(itertools.pairwise(rows))
        if n != 10
    )
    succeeded = [job.id for n, job in enumerate(jobs) if n != 10]
    assert sorted(recorder.events.of("success")) == succeeded
    assert recorder.events.of("fail") == [jobs[10].id]
    assert queue.get(jobs[10].id).state is JobState.DEAD


def _record_transactions(db: psycopg.Connection, schema: str) -> None:
    """Record, in ``xacts``, the transaction that claimed each job and the one that
    finished it."""
    db.execute(
        f"""CREATE TABLE "{schema}".xacts (job_id bigint, event text, xact xid8);
        CREATE FUNCTION "{schema}".record_xact() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO "{schema}".xacts VALUES (NEW.id, TG_ARGV[0], pg_current_xact_id());
            RETURN NULL;
        END $$;
        CREATE TRIGGER claimed AFTER UPDATE ON "{schema}".active_jobs FOR EACH ROW
            WHEN (OLD.state = 'queued' AND NEW.state = 'running')
            EXECUTE FUNCTION "{schema}".record_xact('claimed');
        CREATE TRIGGER finished AFTER INSERT ON "{schema}".finished_jobs FOR EACH ROW
            EXECUTE FUNCTION "{schema}".record_xact('finished');"""
    )
