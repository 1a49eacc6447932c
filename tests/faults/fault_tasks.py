"""Tasks the fault scenarios' worker processes run: ``pgqueue worker --plugin fault_tasks``.

``fault_work`` leaves evidence of every invocation in a local file before it does
anything else, so the evidence survives the database being down, crashed, full or
failed over: one line ``job_id attempt lease_token pid`` appended to
``invocations-<pid>.log`` in the directory named by ``PGQUEUE_FAULTS_RUN_DIR``. Then it
works for ``payload["ms"]`` milliseconds (a number, or ``[low, high]`` for a random
duration) and returns which attempt, under which lease, in which process, ran it: the
stored result names the one attempt whose ack was written.

Optional misbehaviour, decided per invocation: ``fail_rate`` (raise), ``stall_rate``
with ``stall_seconds`` (overrun the lease, so the reaper takes the job back).

``fault_partition_work`` is ``fault_work`` for jobs with partition keys: it also
appends a line when it starts and when it ends (``start|end job_id attempt key time
pid``, wall-clock time) to ``spans-<pid>.log`` in the same directory, from which a
scenario counts how many jobs of one key ran at once.

``fault_decode`` stands for a handler with a payload contract (``{"image": <base64>}``)
that some producer did not respect.
"""

from __future__ import annotations

import base64
import os
import random
import time
from collections.abc import Callable
from typing import Any

from pgqueue import Job, hookimpl
from pgqueue_bench.verdict.deliveries import LazyInvocationLog

RUN_DIR_VARIABLE = "PGQUEUE_FAULTS_RUN_DIR"
WORK_TASK = "fault_work"
PARTITION_TASK = "fault_partition_work"
SPANS_PREFIX = "spans-"
DECODE_TASK = "fault_decode"

_invocations = LazyInvocationLog(RUN_DIR_VARIABLE)


class InjectedFailure(Exception):
    """Raised on purpose by ``fault_work`` when its payload asks for failures."""


def _record_invocation(job: Job) -> None:
    """One line per invocation, unbuffered: a SIGKILL loses no line (see
    :class:`pgqueue_bench.verdict.deliveries.InvocationLog`)."""
    _invocations.append(job.id, job.attempts, job.lease_token)


def _work_seconds(payload: dict[str, Any]) -> float:
    ms = payload.get("ms", 20)
    if isinstance(ms, list):
        low, high = ms
        return random.uniform(low, high) / 1000
    return float(ms) / 1000


def work(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """Record the invocation, misbehave if asked to, work, and say who did it."""
    _record_invocation(job)
    if random.random() < float(payload.get("fail_rate", 0)):
        raise InjectedFailure(f"attempt {job.attempts} of job {job.id} failed on purpose")
    if random.random() < float(payload.get("stall_rate", 0)):
        time.sleep(float(payload.get("stall_seconds", 0)))
    time.sleep(_work_seconds(payload))
    return {"attempt": job.attempts, "token": str(job.lease_token), "pid": os.getpid()}


def _span(edge: str, job: Job) -> None:
    """One line, in one unbuffered append: lines of concurrent handlers never mix, and
    a SIGKILL loses none that was written."""
    directory = os.environ.get(RUN_DIR_VARIABLE)
    if not directory:
        return
    line = f"{edge} {job.id} {job.attempts} {job.partition_key} {time.time():.6f} {os.getpid()}\n"
    path = os.path.join(directory, f"{SPANS_PREFIX}{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def partition_work(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """:func:`work`, between a start and an end line of the job's span."""
    _span("start", job)
    try:
        return work(payload, job)
    finally:
        _span("end", job)


def decode(payload: dict[str, Any], job: Job) -> dict[str, int]:
    """Decode ``payload["image"]`` (base64) and return its size; anything else raises."""
    _record_invocation(job)
    image = payload.get("image")
    if not isinstance(image, str):
        raise ValueError(f"payload.image must be a base64 string, not {type(image).__name__}")
    return {"bytes": len(base64.b64decode(image, validate=True))}


@hookimpl
def register_tasks(register: Callable[..., None]) -> None:
    register(WORK_TASK, work)
    register(PARTITION_TASK, partition_work)
    register(DECODE_TASK, decode)
