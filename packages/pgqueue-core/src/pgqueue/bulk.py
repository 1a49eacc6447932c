"""Adding many keyless jobs with COPY, the fastest way PostgreSQL takes rows in.

``enqueue_many`` sends small batches as one INSERT over arrays. For larger ones (see
COPY_MIN_JOBS) the arrays cost more than the rows: the client escapes every element in
Python, and the server unnests one array per column and computes each row's run_at,
where COPY takes the rows as they are. So a keyless batch of COPY_MIN_JOBS or more
takes three steps in one transaction:

1. ``job_ids_reserve`` takes the batch's ids from the job sequence, in order, and reads
   the transaction's ``now()``: the database clock, the same value the rows' defaults
   (``enqueued_at``) and an INSERT's ``now() + delay`` would use;
2. ``job_copy`` streams the rows, with those ids and each run_at computed from that
   clock, so that every column of every job is known without reading anything back
   (``job_copy_runnable_now`` when no job is delayed: run_at then defaults to that
   clock, and no row carries a timestamp);
3. ``queues_wake`` notifies the queues that have a waiting worker, as the INSERT
   statements' wake-up does.

Keyed batches keep the INSERT: an idempotency key or a unique key needs ON CONFLICT,
which COPY lacks (see pgqueue/keyed.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import psycopg

from pgqueue import jsonb, queries, tracing
from pgqueue.job import Job

if TYPE_CHECKING:
    from pgqueue.job_spec import JobSpec

COPY_MIN_JOBS = 40
"""Batches of at least this many keyless jobs go through COPY. Below it, the two extra
round trips cost more than COPY saves; above it, an INSERT's arrays cost the client
more than COPY's rows, since psycopg escapes every element of a text array in Python.
A ``POST /jobs/batch`` of 100 jobs takes COPY."""


def copy_jobs(
    conn: psycopg.Connection,
    schema: str,
    specs: Sequence[JobSpec],
    trace_context: str | None = None,
) -> list[Job]:
    """Add ``specs`` (none with an idempotency or a unique key) on ``conn`` by COPY, in the
    connection's current transaction, and return their jobs in input order.
    ``trace_context`` (JSON text, see :mod:`pgqueue.tracing`) is stored with each job.

    ``conn`` must not be in autocommit mode: the three statements have to be one
    transaction, or a failure halfway would leave ids taken and jobs missing.
    """
    cur = conn.cursor()
    reserved = cur.execute(
        queries.bind("job_ids_reserve", schema), {"count": len(specs)}
    ).fetchone()
    assert reserved is not None
    now, ids = reserved
    # A batch with no delayed job leaves run_at to its default, now(): the clock read
    # above, and no row then carries a timestamp, the dearest column to send.
    timed = any(spec.run_at is not None or spec.delay_seconds for spec in specs)
    run_ats = [_run_at(spec, now) for spec in specs] if timed else [now] * len(specs)
    copy_in = queries.bind("job_copy" if timed else "job_copy_runnable_now", schema)
    # As the table gives them back: the stored JSON texts, loaded in one parse.
    payloads = jsonb.load_json_texts([spec.payload_text for spec in specs])
    traced = tracing.loaded_trace_context(trace_context)
    jobs = []
    with cur.copy(copy_in) as copy:
        # Each job is built as its row is written: psycopg sends the rows in blocks of
        # some hundreds, and the server stores one block while this builds the next.
        for job_id, spec, run_at, payload in zip(ids, specs, run_ats, payloads, strict=True):
            first = (job_id, spec.queue, spec.task, spec.payload_text, spec.priority)
            rest = (
                spec.max_attempts,
                spec.timeout_seconds,
                trace_context,
                list(spec.tags) if spec.tags else None,
                spec.partition_key,
            )
            copy.write_row((*first, run_at, *rest) if timed else first + rest)
            jobs.append(
                spec.queued_job(job_id, run_at, now, loaded_payload=payload, trace_context=traced)
            )
    queues = sorted({spec.queue for spec in specs})
    cur.execute(queries.bind("queues_wake", schema), {"queues": queues})
    return jobs


def _run_at(spec: JobSpec, now: datetime) -> datetime:
    """When the job may first run, on the database's clock (as job_insert computes it)."""
    if spec.run_at is not None:
        return spec.run_at
    return now + timedelta(seconds=spec.delay_seconds or 0.0)
