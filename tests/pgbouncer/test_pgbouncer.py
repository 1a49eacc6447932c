"""pgqueue behind PgBouncer in transaction pooling mode: a real worker process and the
real API app, every connection through PgBouncer, which shares a few server
connections among all of them.

What breaks behind transaction pooling is session state: a server-side prepared
statement, a session advisory lock, or LISTEN lives on one server connection, and the
next transaction may run on another. So the worker runs with ``--no-prepare`` and
``--no-listen`` (polling), the API's Queue with ``prepare=False``, and the reaper's and
pruner's locks are transaction-scoped.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import psycopg
from pgbouncer_support import POOL_SIZE, Bouncer
from polling import wait_for
from processes import environment, pgqueue_command, start_worker, stop
from psycopg import sql
from serving import serve

from pgqueue import JobSpec, JobState, Queue, WorkerProtocol
from pgqueue.locks import advisory_key
from pgqueue_api.app import create_app
from pgqueue_api.settings import ApiSettings

HERE = Path(__file__).resolve().parent
JOBS = 40


def _start_worker(bouncer: Bouncer, schema: str, log_path: Path, *extra: str) -> subprocess.Popen:
    args = [
        "--database-url",
        bouncer.url,
        "--schema",
        schema,
        "--no-plugin-autoload",
        "--handlers",
        "pgbouncer_handlers:HANDLERS",
        "--no-listen",
        "--no-prepare",
        "--concurrency",
        "4",
        "--poll-interval",
        "0.1",
        "--reap-interval",
        "0.2",
        "--retry-base",
        "0.05",
        *extra,
    ]
    return start_worker(args, environment(HERE), log_path)


def test_worker_and_api_run_jobs_end_to_end_through_pgbouncer(bouncer, schema, tmp_path):
    log_path = tmp_path / "worker.log"
    worker = _start_worker(bouncer, schema, log_path)
    api_queue = Queue.connect(bouncer.url, schema=schema, min_size=2, max_size=4, prepare=False)
    app = create_app(ApiSettings(database_url=bouncer.url, schema=schema), queue=api_queue)
    try:
        with serve(app) as base_url, httpx.Client(base_url=base_url, timeout=30) as client:
            created = client.post(
                "/jobs/batch",
                json={
                    "jobs": [
                        *({"task": "echo", "payload": {"n": n}} for n in range(JOBS)),
                        {"task": "fail", "max_attempts": 2},
                    ]
                },
            )
            assert created.status_code == 201, created.text
            ids = [item["job"]["id"] for item in created.json()["items"]]
            later = client.post("/jobs", json={"task": "echo", "delay_seconds": 3600})
            assert client.post(f"/jobs/{later.json()['id']}/cancel").status_code == 200

            def states() -> dict[int, str]:
                return {job_id: client.get(f"/jobs/{job_id}").json()["state"] for job_id in ids}

            finished = wait_for(
                lambda: (
                    (s := states()) and all(v in ("succeeded", "dead") for v in s.values()) and s
                ),
                what=f"the jobs to finish; worker log:\n{log_path.read_text()}",
                interval=0.1,  # each poll asks the API for every job
            )
            # Clients outnumber the server connections PgBouncer may open: they share them.
            pools = [p for p in bouncer.pools() if p["database"] != "pgbouncer"]
            clients = sum(p["cl_active"] + p["cl_waiting"] for p in pools)
            servers = sum(p["sv_active"] + p["sv_idle"] + p["sv_used"] for p in pools)
            metrics = client.get("/metrics").text
            health = client.get("/healthz")
            job = client.get(f"/jobs/{ids[0]}").json()
    finally:
        (exit_code,) = stop([worker])
        api_queue.close()

    log = log_path.read_text()
    assert list(finished.values()) == ["succeeded"] * JOBS + ["dead"], log
    assert job["result"] == {"n": 0}
    assert clients > servers
    assert servers <= POOL_SIZE
    assert f'pgqueue_jobs{{queue="default",state="succeeded"}} {JOBS}.0' in metrics
    assert 'pgqueue_jobs{queue="default",state="cancelled"} 1.0' in metrics
    assert health.status_code == 200
    # Session state lost between transactions would show up as database errors.
    assert "prepared statement" not in log
    assert "database unavailable" not in log
    assert "claim loop error" not in log
    assert exit_code == 0, log


def test_reaper_and_pruner_locks_end_with_their_transaction_behind_pgbouncer(
    bouncer, schema, database_url
):
    """A session-level advisory lock would stay on whichever server connection PgBouncer
    ran it on, held for the next client that gets that connection; the transaction-scoped
    locks of the reaper and the pruner end at commit, so every round gets its turn."""
    rounds = 3 * POOL_SIZE
    with Queue.connect(bouncer.url, schema=schema, max_size=POOL_SIZE, prepare=False) as queue:
        protocol = WorkerProtocol(queue)
        queue.enqueue_many([JobSpec("echo"), JobSpec("echo")])
        (done,) = protocol.claim(["default"], ["echo"], limit=1)
        protocol.ack(done)
        (stalled,) = protocol.claim(["default"], ["echo"], limit=1, lease_seconds=0.001)
        with psycopg.connect(database_url, autocommit=True) as db:
            db.execute(
                sql.SQL(
                    "UPDATE {}.finished_jobs SET finished_at = now() - interval '2 days'"
                ).format(sql.Identifier(schema))
            )
        time.sleep(0.01)  # past the stalled job's lease
        reaped = [protocol.reap() for _ in range(rounds)]
        pruned = [queue.prune_expired({JobState.SUCCEEDED: 3600}) for _ in range(rounds)]
        assert [[job.id for job in r] for r in reaped] == [[stalled.id]] + [[]] * (rounds - 1)
        assert pruned == [1] + [0] * (rounds - 1)

        with psycopg.connect(bouncer.url, prepare_threshold=None) as other:
            assert other.execute(
                "SELECT pg_try_advisory_xact_lock(%s)", (advisory_key("prune", schema),)
            ).fetchone()[0], "a lock from an earlier round was still held"
            assert queue.prune_expired({JobState.SUCCEEDED: 3600}) is None
            other.rollback()
        assert queue.prune_expired({JobState.SUCCEEDED: 3600}) == 0


def test_cli_commands_work_through_pgbouncer(bouncer, schema, database_url):
    """``pgqueue prune`` runs one statement per batch: more than enough for a client
    that prepares statements to prepare it, and then to miss it on another server
    connection."""
    batches = 4 * POOL_SIZE
    with Queue.connect(database_url, schema=schema, max_size=1) as queue:
        protocol = WorkerProtocol(queue)
        queue.enqueue_many([JobSpec("echo")] * batches)
        for job in protocol.claim(["default"], ["echo"], limit=batches):
            protocol.ack(job)
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(
            sql.SQL("UPDATE {}.finished_jobs SET finished_at = now() - interval '2 days'").format(
                sql.Identifier(schema)
            )
        )
    through = ["--database-url", bouncer.url, "--schema", schema]
    pruned = subprocess.run(
        [*pgqueue_command(), "prune", "--older-than", "1d", "--batch-size", "1", *through],
        capture_output=True,
        text=True,
        timeout=120,
    )
    status = subprocess.run(
        [*pgqueue_command(), "status", "--json", *through],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.strip() == f"pruned {batches} jobs"
    assert status.returncode == 0, status.stderr
    # Nothing left in any queue; a queue stays listed for its attempt counters.
    listed = json.loads(status.stdout)
    assert listed and all(not any(entry["counts"].values()) for entry in listed), listed
