"""The real queue against a model of its state machine, in random interleavings.

Hypothesis drives pgqueue's core on real PostgreSQL through sequences of:

- enqueues of every kind (priorities, delays, idempotency and unique keys, dependencies
  on jobs in any state and on unknown ones, fan-ins, fan-outs and chains, batches whose
  items depend on earlier items), through the queue's pool and inside a caller's own
  transaction (idle, after a statement of its own, in autocommit, or a pooled
  connection's) that then commits or rolls back, with a worker's heartbeat, claim or ack
  made while it is open (rules_producing.py);
- claims by two logical workers, alone and with their acks, heartbeats, acks and
  failures (current and stale leases), lease expiry and reaping, and rows inserted by
  raw SQL whose payload Python cannot decode (rules_working.py);
- completions inside the holder's own transaction (``job.complete(conn)`` beside an
  application row), by current and stale holders, committed, rolled back, or committed
  after a caught ``LeaseLost``, with lease expiry, the reaper and the other worker's
  claim racing them before they complete, and the reaper, claims and heartbeats running
  while a completed transaction is still open (rules_effects.py);
- cancels (and their cascades), retries (of waiting, dead and cancelled jobs, with
  dependencies met or not), pausing and resuming queues, concurrency and rate limits,
  pruning by hand and by retention across the history's day and DEFAULT partitions, and
  reading jobs back (rules_operating.py);
- schedules declared, switched and ticked (rules_schedules.py);
- callbacks in dependency_mode="finished" over jobs in any state and over groups of a
  batch, some of which die (rules_dependency_modes.py);
- jobs with partition keys on a queue of their own, claimed round-robin across keys
  from the key after the last one served, under a partition concurrency limit, and
  throttles of a job, a key or the queue, by a handler (current and stale leases) or an
  operator, ended by time passing (rules_flow.py).

After every step the whole database is compared with the model (queue_model.py; see
invariants.py): each job's state, attempts, lease and its expiry, the reason of a
cancellation by a dependency, that it is in exactly one of the two job tables, that
nothing appeared or disappeared before it was pruned; the dependency edges and the
queues' counts; that nothing is queued or running before its dependencies succeeded;
that timestamps are in the order of the events; that the application table holds
exactly one row per job completed in a committed transaction, none for any other; that
the throttles in force are the model's. Claims must take exactly what the model says,
so a waiting job is never claimed, nor a job of a paused or throttled queue or key, nor
one past its key's concurrency limit.

The only SQL the test writes itself stands for time passing (a lease's expiry, a job's
history, a schedule's next run moved into the past) or for another client's rows.
Retries back off for at most a millisecond, which each claim lets pass first, so that
the model knows exactly which jobs a claim must take.

``nox -s tests`` runs a fixed budget of examples; ``nox -s model`` runs for minutes and
writes its statistics to results/model.json (``PGQUEUE_MODEL_SECONDS``).
"""

from __future__ import annotations

import os
import time
import uuid

import psycopg
import psycopg_pool
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from invariants import Invariants
from machine import APPLICATION_TABLE, CALLER_TABLE, STATISTICS, MachineBase
from model_results import write_model_results
from psycopg import sql
from rules_dependency_modes import DependencyModeRules
from rules_effects import EffectsRules
from rules_flow import FlowRules
from rules_operating import OperatingRules
from rules_producing import ProducingRules
from rules_schedules import ScheduleRules
from rules_working import WorkingRules

from pgqueue import migrate


class QueueMachine(
    ProducingRules,
    WorkingRules,
    EffectsRules,
    OperatingRules,
    ScheduleRules,
    DependencyModeRules,
    FlowRules,
    Invariants,
    MachineBase,
):
    """One example: a schema as new, a queue on it, the model beside it, and every rule."""


@pytest.fixture
def machine(database_url: str):
    schema = f"model_{uuid.uuid4().hex[:10]}"
    migrate(database_url, schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (note text NOT NULL)").format(
                sql.Identifier(schema, CALLER_TABLE)
            )
        )
        conn.execute(
            sql.SQL("CREATE TABLE {} (job_id bigint NOT NULL, token uuid NOT NULL)").format(
                sql.Identifier(schema, APPLICATION_TABLE)
            )
        )
    # A statement that waits this long is a defect to report, not a reason to hang.
    bounded = {"options": "-c statement_timeout=60s -c lock_timeout=30s"}
    # A worker's call made while a producer's transaction is open must not wait for it.
    probing = {"options": "-c statement_timeout=60s -c lock_timeout=1s"}
    with (
        psycopg_pool.ConnectionPool(
            database_url, min_size=1, max_size=2, kwargs=bounded, open=True
        ) as pool,
        psycopg_pool.ConnectionPool(
            database_url, min_size=1, max_size=1, kwargs=probing, open=True
        ) as probe_pool,
    ):
        QueueMachine.pool = pool
        QueueMachine.probe_pool = probe_pool
        QueueMachine.database_url = database_url
        QueueMachine.schema = schema
        yield QueueMachine
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


# Shrinking a failure replays examples on the database: give it time to finish.
@pytest.mark.timeout(900)
def test_the_queue_behaves_as_its_model(machine) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            # About 30 s on two cores: it runs in every CI run, on each PostgreSQL.
            max_examples=int(os.environ.get("PGQUEUE_MODEL_EXAMPLES", "40")),
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


LONG_RUN_SECONDS = float(os.environ.get("PGQUEUE_MODEL_SECONDS", "0"))


@pytest.mark.skipif(not LONG_RUN_SECONDS, reason="the long run: nox -s model")
# Past the time asked for by one batch of examples at most; stops at the first failure.
@pytest.mark.timeout(LONG_RUN_SECONDS + 900)
def test_the_queue_behaves_as_its_model_for_minutes(machine, server_version: int) -> None:
    deadline = time.monotonic() + LONG_RUN_SECONDS
    started = time.monotonic()
    runs = 0
    while time.monotonic() < deadline:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=20,
                stateful_step_count=60,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
        runs += 1
    write_model_results(STATISTICS, server_version, time.monotonic() - started, runs)
