"""Producers whose acknowledged enqueues are recorded: one half of the evidence a run
is judged by (the other is the audit trail, :mod:`pgqueue_bench.verdict.audit`).

A producer sends batches in a thread of its own, in-process through
``Queue.enqueue_many`` or over HTTP through ``POST /jobs/batch``. A batch the queue
refuses (the database down or read-only, a broken connection, a 503) is sent again
with the same idempotency keys until the queue acknowledges it, so a refusal can
neither lose a job nor add one twice, and what ``acknowledged`` holds is exactly what
a client was told had committed. The fault scenarios and the soak share them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

import httpx

from pgqueue import DatabaseUnavailable, JobSpec, Queue
from pgqueue_bench.verdict.observe import wait_for


class Refused(Exception):
    """The queue did not take a batch this time (503, connection error); retry it."""


class UnexpectedAnswer(RuntimeError):
    """The API answered a batch with neither 201 nor 503: a failure of the run."""


class Rejected(Exception):
    """The queue refused a batch for good (the API's 422): a client does not send it
    again, so its jobs are lost at the producer. Only senders asked to report it raise
    it (see :func:`send_via_api`); the producer records the batch and goes on."""


Send = Callable[[list[JobSpec]], list[int]]


def send_via_queue(queue: Queue) -> Send:
    """Enqueue through ``Queue.enqueue_many``; DatabaseUnavailable means retry."""

    def send(specs: list[JobSpec]) -> list[int]:
        try:
            return [result.job.id for result in queue.enqueue_many(specs)]
        except DatabaseUnavailable as exc:
            raise Refused(str(exc)) from exc

    return send


def send_via_api(client: httpx.Client, *, rejections_lose_jobs: bool = False) -> Send:
    """Enqueue through ``POST /jobs/batch``; 503 (with Retry-After) or a broken
    connection means retry, anything else but 201 raises UnexpectedAnswer. With
    ``rejections_lose_jobs``, a 422 raises Rejected instead: the producer gives the
    batch up, as a client does with a 4xx, and counts its jobs as lost."""

    def send(specs: list[JobSpec]) -> list[int]:
        body = {"jobs": [job_body(spec) for spec in specs]}
        try:
            response = client.post("/jobs/batch", json=body)
        except httpx.TransportError as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 503 and response.headers.get("retry-after"):
            raise Refused(response.json()["detail"])
        if response.status_code == 422 and rejections_lose_jobs:
            raise Rejected(response.json()["detail"])
        if response.status_code != 201:
            raise UnexpectedAnswer(f"POST /jobs/batch: {response.status_code} {response.text}")
        return [item["job"]["id"] for item in response.json()["items"]]

    return send


def job_body(spec: JobSpec) -> dict[str, Any]:
    """The JSON of one job for ``POST /jobs`` and ``/jobs/batch``: the fields of
    ``spec`` that are set."""
    body: dict[str, Any] = {
        "task": spec.task,
        "payload": spec.payload,
        "queue": spec.queue,
        "idempotency_key": spec.idempotency_key,
        "max_attempts": spec.max_attempts,
    }
    # The API's numbers are strict: a float field takes no JSON integer.
    if spec.timeout_seconds is not None:
        body["timeout_seconds"] = float(spec.timeout_seconds)
    if spec.delay_seconds:
        body["delay_seconds"] = float(spec.delay_seconds)
    return body


def send_until_acknowledged(
    send: Send,
    specs: list[JobSpec],
    stopped: threading.Event,
    refusals: list[str] | None = None,
) -> list[int] | None:
    """Send ``specs`` until the queue acknowledges them (backing off from 50 ms to 1 s
    between refusals); the job ids, or None if ``stopped`` was set first."""
    delay = 0.05
    while not stopped.is_set():
        try:
            return send(specs)
        except Refused as exc:
            if refusals is not None:
                refusals.append(str(exc))
            stopped.wait(delay)
            delay = min(delay * 2, 1.0)
    return None


class Producer:
    """Sends ``specs`` in batches from a thread of its own, retrying a refused batch
    (with the same idempotency keys) until the queue acknowledges it.

    It waits ``pause`` seconds after each batch; with ``every``, it starts one batch
    every ``every`` seconds instead, a steady rate that does not rush to catch up after
    an outage (the batches it could not send then are simply later).

    ``acknowledged`` maps each key to the job id the queue answered with: exactly the
    enqueues a client was told had committed. ``refusals`` holds what the refusals said.
    ``rejected`` maps the key of each job of a batch refused for good (Rejected) to
    what the refusal said: jobs lost at the producer.
    """

    def __init__(
        self,
        send: Send,
        specs: Iterable[JobSpec],
        *,
        batch: int = 8,
        pause: float = 0.02,
        every: float | None = None,
        name: str = "producer",
    ) -> None:
        self.send = send
        self.specs = iter(specs)
        self.batch = batch
        self.pause = pause
        self.every = every
        self.acknowledged: dict[str, int] = {}
        self.refusals: list[str] = []
        self.rejected: dict[str, str] = {}
        self.error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        """True once every batch was acknowledged (or the producer stopped or failed)."""
        return not self._thread.is_alive()

    def wait(self, timeout: float = 120.0) -> None:
        """Wait until every batch was acknowledged; re-raise what the thread raised."""
        wait_for(lambda: self.done, timeout, what="the producer to finish")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Send no more batches (the one in flight is finished first)."""
        self._stopped.set()
        self._thread.join(30)

    def _wait_for_next(self, started: float) -> bool:
        """Wait until the next batch is due; False once stopped."""
        if self.every is None:
            return not self._stopped.wait(self.pause)
        return not self._stopped.wait(max(0.0, started + self.every - time.monotonic()))

    def _run(self) -> None:
        try:
            while chunk := list(islice(self.specs, self.batch)):
                started = time.monotonic()
                try:
                    ids = send_until_acknowledged(self.send, chunk, self._stopped, self.refusals)
                except Rejected as exc:
                    for spec in chunk:
                        self.rejected[spec.idempotency_key or ""] = str(exc)
                else:
                    if ids is None:
                        return
                    for spec, job_id in zip(chunk, ids, strict=True):
                        self.acknowledged[spec.idempotency_key] = job_id  # type: ignore[index]
                if not self._wait_for_next(started):
                    return
        except BaseException as exc:
            self.error = exc
