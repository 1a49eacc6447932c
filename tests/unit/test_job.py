"""The Job record."""

import uuid
from dataclasses import fields
from datetime import UTC, datetime

from pgqueue import Job, JobState, Lease

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _running_job() -> Job:
    return Job(
        id=1, queue="q", task="t", payload={"a": 1}, priority=0, state=JobState.RUNNING,
        run_at=NOW, attempts=2, max_attempts=5, timeout_seconds=None,
        lease_token=uuid.uuid4(), lease_expires_at=NOW, worker_id="w", enqueued_at=NOW,
        started_at=NOW, finished_at=None, last_error="earlier",
        errors=[{"attempt": 1, "failed_at": "2030-01-01T00:00:00+00:00", "worker_id": "w",
                 "error": "earlier"}],
        result=None, idempotency_key=None,
    )  # fmt: skip


def test_a_succeeded_copy_changes_only_what_the_ack_changes():
    now = NOW
    running = _running_job()
    done = running.succeeded({"ok": True}, now)
    changed = {f.name for f in fields(Job) if getattr(done, f.name) != getattr(running, f.name)}
    assert changed == {
        "state", "result", "finished_at", "lease_token", "lease_expires_at", "last_error"
    }  # fmt: skip
    assert (done.state, done.result, done.lease_token) == (JobState.SUCCEEDED, {"ok": True}, None)
    # A success ends the job's errors, and keeps their history.
    assert done.last_error is None and done.errors == running.errors
    assert running.state is JobState.RUNNING and running.result is None  # untouched


def test_jobs_from_tuples_in_any_column_order_with_shared_fields():
    job = _running_job()
    shared = {"state": "running", "worker_id": "w", "started_at": NOW}
    names = [f.name for f in fields(Job) if f.name not in shared]
    row = tuple(getattr(job, name) for name in names)
    # In field order (the claim's fast path), and reversed with an extra column.
    assert Job.from_tuples(names, [row], shared) == [job]
    columns = ["unknown", *reversed(names)]
    assert Job.from_tuples(columns, [("x", *reversed(row))], shared) == [job]
    assert Job.from_tuples(names, [row], shared)[0].state is JobState.RUNNING


def test_no_error_history_in_the_row_reads_as_an_empty_list():
    job = _running_job()
    names = [f.name for f in fields(Job)]
    row = tuple(None if name == "errors" else getattr(job, name) for name in names)
    assert Job.from_tuples(names, [row])[0].errors == []
    assert Job.from_row(dict(zip(names, row, strict=True))).errors == []


def test_leases_are_equal_only_with_the_same_token():
    token = uuid.uuid4()
    assert Lease(1, token) == Lease(1, uuid.UUID(str(token)))
    assert len({Lease(1, token), Lease(1, uuid.uuid4()), Lease(2, token)}) == 3
