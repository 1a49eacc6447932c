"""``JobSpec``: a job to enqueue, validated once, as the statements that insert it take it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from pgqueue import jsonb, validation
from pgqueue.dependencies import DEPENDENCY_MODES, BatchItem, checked
from pgqueue.errors import ValidationError
from pgqueue.job import Job, JobState
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE

_QUEUED_JOB_FIELDS: dict[str, Any] = {
    **dict.fromkeys(job_field.name for job_field in fields(Job)),
    "state": JobState.QUEUED,
    "attempts": 0,
}
"""Every field of a job just enqueued, in the order of Job's fields, with the values all
such jobs share (None for the rest, which :meth:`JobSpec.queued_job` fills in)."""

_NO_PAYLOAD: Any = object()
"""The default of ``JobSpec(payload=)``: an empty payload of the spec's own."""


@dataclass(frozen=True, init=False)
class JobSpec:
    """A job to enqueue, validated on construction.

    What the statements take is worked out from the fields once, as the construction
    checks them, and kept in two more fields: :attr:`payload_text` and
    :attr:`dependencies`. The fields given stay as given."""

    task: str
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    delay_seconds: float | None = None
    run_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout_seconds: float | None = None
    unique_key: str | None = None
    """While a queued or running job holds this key, enqueueing another returns that job
    instead (see :mod:`pgqueue.keyed`)."""
    depends_on: Sequence[int | BatchItem] = ()
    """Jobs that must succeed before this one is queued: ids, or earlier items of the
    same ``enqueue_many`` call (see :mod:`pgqueue.dependencies`)."""
    dependency_mode: str = "succeeded"
    """What ``depends_on`` waits for: ``"succeeded"`` (each must succeed; one that ends
    dead or cancelled cancels this job) or ``"finished"`` (each must be final, in any
    state; this job runs whatever they ended as)."""
    tags: tuple[str, ...] = ()
    """Labels to find the job by (``Queue.list(tags=...)``): at most 16 strings of 1 to
    64 characters, each kept once."""
    partition_key: str | None = None
    """The tenant, customer or account the job is for (1 to 200 characters): claims
    take jobs round-robin across keys, and the queue's partition limits hold per key."""
    payload_text: str = field(init=False, repr=False, compare=False)
    """The payload as the JSON text that is stored (validated and measured once)."""
    dependencies: tuple[int | BatchItem, ...] = field(init=False, repr=False, compare=False)
    """``depends_on``, checked, each job once, in the order given."""

    def __init__(
        self,
        task: str,
        payload: dict[str, Any] = _NO_PAYLOAD,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        delay_seconds: float | None = None,
        run_at: datetime | None = None,
        idempotency_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout_seconds: float | None = None,
        unique_key: str | None = None,
        depends_on: Sequence[int | BatchItem] = (),
        dependency_mode: str = "succeeded",
        tags: Sequence[str] = (),
        partition_key: str | None = None,
    ) -> None:
        """Check every field; raises :class:`~pgqueue.errors.ValidationError` naming the
        first one that is wrong."""
        if payload is _NO_PAYLOAD:
            payload = {}
        validation.name("task", task)
        validation.name("queue", queue)
        validation.priority(priority)
        validation.max_attempts(max_attempts)
        if delay_seconds is not None and run_at is not None:
            raise ValidationError("delay_seconds", "give delay_seconds or run_at, not both")
        if delay_seconds is not None:
            validation.seconds("delay_seconds", delay_seconds)
        if run_at is not None:
            validation.run_at(run_at)
        if idempotency_key is not None:
            validation.idempotency_key(idempotency_key)
        if unique_key is not None:
            validation.unique_key(unique_key)
        if timeout_seconds is not None:
            validation.seconds("timeout_seconds", timeout_seconds, positive=True)
        if partition_key is not None:
            validation.partition_key(partition_key)
        if dependency_mode not in DEPENDENCY_MODES:
            raise ValidationError(
                "dependency_mode", f"must be one of {', '.join(map(repr, DEPENDENCY_MODES))}"
            )
        # Written by hand, to fill the instance's dict in one update: the frozen
        # dataclass's generated __init__ sets each field through object.__setattr__,
        # one call per field, and large enqueues build thousands of specs.
        # What the statements take is worked out (and so checked) now, not when the job
        # is enqueued.
        self.__dict__.update(
            task=task,
            payload=payload,
            queue=queue,
            priority=priority,
            delay_seconds=delay_seconds,
            run_at=run_at,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            unique_key=unique_key,
            depends_on=depends_on,
            dependency_mode=dependency_mode,
            tags=validation.tags(tags) if tags else (),
            partition_key=partition_key,
            payload_text=validation.payload(payload),
            dependencies=checked(depends_on) if depends_on else (),
        )

    @property
    def single_statement(self) -> bool:
        """Whether enqueueing this job alone is one INSERT: no idempotency key, no unique
        key and no dependencies, each of which takes statements of its own."""
        return self.idempotency_key is None and self.unique_key is None and not self.dependencies

    def queued_job(
        self,
        job_id: int,
        run_at: datetime,
        enqueued_at: datetime,
        *,
        loaded_payload: dict[str, Any] | None = None,
        trace_context: dict[str, str] | None = None,
    ) -> Job:
        """The job this spec became, as the table holds it right after the insert that
        gave it ``job_id`` and those times, with ``trace_context`` if the enqueue was
        traced (the rest is the spec's). ``loaded_payload`` is :attr:`payload_text`
        already loaded, by a caller that loads many at once."""
        if loaded_payload is None:
            # As the table gives it back: the stored JSON text, loaded.
            loaded_payload = jsonb.load_json(self.payload_text.encode())
        # Every field, each of its type, from a copy of the fields every new job shares:
        # built without the frozen dataclass's __init__, which would cost more than the
        # rest of a large enqueue's Python per job.
        values = _QUEUED_JOB_FIELDS.copy()
        values["id"] = job_id
        values["queue"] = self.queue
        values["task"] = self.task
        values["payload"] = loaded_payload
        values["priority"] = self.priority
        values["run_at"] = run_at
        values["max_attempts"] = self.max_attempts
        values["timeout_seconds"] = self.timeout_seconds
        values["enqueued_at"] = enqueued_at
        values["errors"] = []
        values["idempotency_key"] = self.idempotency_key
        values["unique_key"] = self.unique_key
        values["tags"] = list(self.tags)
        values["partition_key"] = self.partition_key
        values["trace_context"] = trace_context
        return Job.from_fields(values)

    def params(self) -> dict[str, Any]:
        """Statement parameters for ``job_insert`` and ``job_insert_many``."""
        return {
            "queue": self.queue,
            "task": self.task,
            "payload": self.payload_text,
            "priority": self.priority,
            "run_at": self.run_at,
            # Floats always: the statements over arrays send one list per column, and
            # psycopg cannot send a list that mixes ints and floats.
            "delay_seconds": float(self.delay_seconds or 0.0),
            "max_attempts": self.max_attempts,
            "timeout_seconds": None
            if self.timeout_seconds is None
            else float(self.timeout_seconds),
            "idempotency_key": self.idempotency_key,
            "trace_context": None,  # JSON text, set by an enqueue that is traced
            # job_insert takes the list; the statements over arrays take JSON text (an
            # array of arrays must be rectangular). NULL for none.
            "tags": list(self.tags) if self.tags else None,
            "tags_json": json.dumps(list(self.tags)) if self.tags else None,
            "partition_key": self.partition_key,
        }
