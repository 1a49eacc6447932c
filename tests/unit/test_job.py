"""The Job record."""

import uuid
from dataclasses import fields
from datetime import UTC, datetime

from pgqueue import Job, JobState


def test_a_succeeded_copy_changes_only_what_the_ack_changes():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    running = Job(
        id=1, queue="q", task="t", payload={"a": 1}, priority=0, state=JobState.RUNNING,
        run_at=now, attempts=2, max_attempts=5, timeout_seconds=None,
        lease_token=uuid.uuid4(), lease_expires_at=now, worker_id="w", enqueued_at=now,
        started_at=now, finished_at=None, last_error="earlier", result=None,
        idempotency_key=None,
    )  # fmt: skip
    done = running.succeeded({"ok": True}, now)
    changed = {f.name for f in fields(Job) if getattr(done, f.name) != getattr(running, f.name)}
    assert changed == {"state", "result", "finished_at", "lease_token", "lease_expires_at"}
    assert (done.state, done.result, done.lease_token) == (JobState.SUCCEEDED, {"ok": True}, None)
    assert running.state is JobState.RUNNING and running.result is None  # untouched
