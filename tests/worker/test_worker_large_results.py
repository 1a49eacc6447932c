"""Large results in a real ``pgqueue worker``: many at once, and over the limit.

Before pgqueue sent its COMMITs as statements, 60 results of 100 kB at concurrency 8
went into one ack that never returned: the jobs stayed running forever, their leases
kept alive by the heartbeat."""

from __future__ import annotations

import signal
import time

import pytest
from polling import wait_for
from worker_support import FAST

from pgqueue import JobState, Queue

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def finished(queue: Queue, ids: list[int]) -> bool:
    return all(queue.get(i).state in (JobState.SUCCEEDED, JobState.DEAD) for i in ids)


def test_sixty_results_of_100_kb_at_concurrency_8_all_finish(start_worker, queue: Queue) -> None:
    ids = [queue.enqueue("echo", {"n": n, "blob": "b" * 100_000}).job.id for n in range(60)]
    started = time.monotonic()
    worker = start_worker(*FAST, "--concurrency", "8")
    wait_for(lambda: finished(queue, ids), 120, "all 60 jobs to finish")
    print(f"60 x 100 kB results finished {time.monotonic() - started:.2f} s after start")
    assert {queue.get(i).state for i in ids} == {JobState.SUCCEEDED}
    assert all(len(queue.get(i).result["blob"]) == 100_000 for i in ids)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_result_over_the_limit_fails_its_attempts_with_the_sizes_named(
    start_worker, queue: Queue
) -> None:
    # A producer with a higher payload limit; the worker keeps the default result limit.
    producer = Queue(queue.pool, schema=queue.schema, max_payload_bytes=8_000_000)
    job = producer.enqueue("echo", {"blob": "b" * 3_000_000}, max_attempts=2).job
    worker = start_worker(*FAST)
    wait_for(lambda: queue.get(job.id).state is JobState.DEAD, 120, "the job to die")
    dead = queue.get(job.id)
    assert dead.attempts == 2
    assert dead.last_error == (
        "result could not be stored: result is 3000011 bytes, over the limit of 1048576"
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
