"""Task handlers the drivers run in real ``pgqueue worker`` processes::

    pgqueue worker --handlers pgqueue_bench.handlers:HANDLERS

``bench_noop`` does nothing, to measure the queue alone. ``bench_sleep`` sleeps
``payload["sleep_ms"]`` milliseconds and touches nothing else: a job of a known length
that costs the database only its claim and ack (it notes when it started in a local
file, see :func:`handler_starts`). ``bench_record_delivery``
commits a delivery row, then works for a random 10-50 ms (``payload["work_ms"]``
overrides the range); the crash and restart drivers count those rows.

The recording handler finds its database in environment variables that the drivers
set for every worker they start: :data:`DATABASE_URL_VARIABLE` and
:data:`SCHEMA_VARIABLE`, and, to log invocations to local files as well,
:data:`RUN_DIR_VARIABLE`.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from pgqueue import Job, JobSpec
from pgqueue_bench.verdict.deliveries import DeliveryRecorder, InvocationLog

NOOP_TASK = "bench_noop"
SLEEP_TASK = "bench_sleep"
RECORD_TASK = "bench_record_delivery"

DATABASE_URL_VARIABLE = "PGQUEUE_BENCH_DATABASE_URL"
SCHEMA_VARIABLE = "PGQUEUE_BENCH_SCHEMA"
RUN_DIR_VARIABLE = "PGQUEUE_BENCH_RUN_DIR"

DEFAULT_WORK_MS = (10, 50)
STARTS_PREFIX = "starts-"

_setup_lock = threading.Lock()
_recorder: DeliveryRecorder | None = None
_invocations: InvocationLog | None = None
_starts: TextIO | None = None


def _recording_targets() -> tuple[DeliveryRecorder, InvocationLog | None]:
    global _recorder, _invocations
    with _setup_lock:
        if _recorder is None:
            try:
                url = os.environ[DATABASE_URL_VARIABLE]
                schema = os.environ[SCHEMA_VARIABLE]
            except KeyError as missing:
                raise RuntimeError(
                    f"{RECORD_TASK} needs {missing.args[0]} in the worker's environment"
                ) from None
            run_dir = os.environ.get(RUN_DIR_VARIABLE)
            _invocations = InvocationLog(run_dir) if run_dir else None
            _recorder = DeliveryRecorder(url, schema)
        return _recorder, _invocations


def noop(payload: dict[str, Any]) -> None:
    """Do nothing: what is left is the queue's own cost per job."""
    return None


def _starts_file() -> TextIO | None:
    """This process's file of handler starts in the run's folder, or None without one."""
    global _starts
    if _starts is None:
        run_dir = os.environ.get(RUN_DIR_VARIABLE)
        if run_dir is None:
            return None
        # Line-buffered: every start is in the file once written, whenever the worker stops.
        _starts = (Path(run_dir) / f"{STARTS_PREFIX}{os.getpid()}.txt").open("a", buffering=1)
    return _starts


def sleep(payload: dict[str, Any], job: Job) -> None:
    """Note the job's start (its id and this machine's clock) in the run's folder, if
    there is one, then sleep ``payload["sleep_ms"]`` milliseconds: a handler's fixed
    time, nothing else."""
    started = time.time()
    with _setup_lock:
        starts = _starts_file()
        if starts is not None:
            starts.write(f"{job.id} {started:.6f}\n")
    time.sleep(float(payload["sleep_ms"]) / 1000)


def handler_starts(run_dir: Path) -> dict[int, float]:
    """When each ``bench_sleep`` job's handler first started, by job id, in seconds
    since the epoch on this machine's clock, from the files its workers wrote in
    ``run_dir``."""
    starts: dict[int, float] = {}
    for path in run_dir.glob(f"{STARTS_PREFIX}*.txt"):
        for line in path.read_text().splitlines():
            job_id, _, at = line.partition(" ")
            if at:  # a line cut short by a killed worker has no time
                starts[int(job_id)] = min(float(at), starts.get(int(job_id), float(at)))
    return starts


def record_delivery(payload: dict[str, Any], job: Job) -> None:
    """Log the invocation, commit a delivery row, then work for 10-50 ms."""
    recorder, invocations = _recording_targets()
    if invocations is not None:
        invocations.append(job.id, job.attempts, job.lease_token)
    recorder.record(job.id, job.attempts)
    low, high = payload.get("work_ms", DEFAULT_WORK_MS)
    time.sleep(random.uniform(low, high) / 1000)


HANDLERS = {NOOP_TASK: noop, SLEEP_TASK: sleep, RECORD_TASK: record_delivery}


def recording_jobs(
    count: int, *, queue: str, work_ms: tuple[int, int], max_attempts: int
) -> list[JobSpec]:
    """``count`` jobs of the recording task on ``queue``, numbered 0 to ``count - 1`` by
    ``payload["seq"]``, each working for ``work_ms`` (a range in milliseconds)."""
    return [
        JobSpec(
            RECORD_TASK,
            {"seq": seq, "work_ms": list(work_ms)},
            queue=queue,
            max_attempts=max_attempts,
        )
        for seq in range(count)
    ]
