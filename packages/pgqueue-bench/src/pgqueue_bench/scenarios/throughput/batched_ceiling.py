"""The batched ceiling, which the worker's default drain is measured against
(``pgqueue bench throughput --mode batched-ceiling``).

The naive loop's table and loop (:mod:`pgqueue_bench.scenarios.throughput.naive_loop`),
with the two things that make pgqueue's default drain fast and nothing else: each claim
statement takes up to ``BATCH`` jobs (``FOR UPDATE SKIP LOCKED`` with that LIMIT) and
one ack statement finishes all of them, by id. No lease (no token, no expiry, so nothing
could take a crashed process's jobs back), no heartbeat, no reaper, no LISTEN (an empty
claim sleeps the naive loop's poll interval), no threads, no hooks, no counters: the
least work per job a batching worker can do on PostgreSQL, so the rate it reaches is a
ceiling for the worker's default drain on the same server. Run as a module, this file is
one loop process::

    python -m pgqueue_bench.scenarios.throughput.batched_ceiling DATABASE_URL SCHEMA QUEUE
"""

from __future__ import annotations

import os
import socket
import sys
import time

import psycopg

from pgqueue_bench import handlers
from pgqueue_bench.scenarios.throughput.naive_loop import (
    POLL_SECONDS,
    READY_LINE,
    SQL_FILE,
    NaiveLoopFleet,
)
from pgqueue_bench.sql.queries import schema_statement_in

BATCH = 100
"""Jobs per claim statement, and so per ack statement."""


def serve(url: str, schema: str, queue: str) -> None:
    """Claim up to ``BATCH`` jobs, run them one after another, ack them together; forever
    (until a signal ends the process)."""
    claim = schema_statement_in(SQL_FILE, "ceiling_jobs_claim", schema)
    ack = schema_statement_in(SQL_FILE, "ceiling_jobs_ack", schema)
    claim_params = {
        "queues": [queue],
        "tasks": [handlers.NOOP_TASK],
        "limit": BATCH,
        "worker_id": f"{socket.gethostname()}:{os.getpid()}",
    }
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        print(READY_LINE, flush=True)
        while True:
            claimed = conn.execute(claim, claim_params).fetchall()
            if not claimed:
                time.sleep(POLL_SECONDS)
                continue
            for _, payload in claimed:
                handlers.noop(payload)
            conn.execute(ack, {"ids": [job_id for job_id, _ in claimed]})


class BatchedCeilingFleet(NaiveLoopFleet):
    """Batched ceiling processes, started and stopped as the naive loop's are."""

    loop_module = __name__


if __name__ == "__main__":
    serve(*sys.argv[1:4])
