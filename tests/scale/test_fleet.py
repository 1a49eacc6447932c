"""A fleet: 64 real ``pgqueue worker`` processes against one database.

They run on a private PostgreSQL cluster of the same version as the suite's server,
with room for their connections, so the shared server's limits are never touched. The
test checks the connection budget each worker documents (at most two pooled
connections for the claim loop, reaper and pruner, one for the heartbeat, one for
LISTEN), that every job runs once, and that the whole fleet stops cleanly.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from polling import wait_for
from processes import environment, start_worker, stop

from pgqueue import JobSpec, JobState, Queue, migrate
from pgqueue_bench.infra.binaries import binaries_for
from pgqueue_bench.infra.servers import PrivateServer

HERE = Path(__file__).resolve().parent
WORKERS = 64
JOBS = 5 * WORKERS
SCHEMA = "fleet"
# The documented budget per worker process, by connection role (application_name).
BUDGET = {"pgqueue-worker": 2, "pgqueue-worker-heartbeat": 1, "pgqueue-worker-listen": 1}
# Beside it, a worker whose pool times out (64 workers on two cores may) probes the
# database on one connection of a moment.
PROBE = "pgqueue-worker-probe"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet_server(server_url: str) -> Iterator[str]:
    """A private cluster with room for 64 workers' connections; yields its URL."""
    server = PrivateServer(binaries_for(server_url), settings={"max_connections": 400})
    with server:
        migrate(server.url(), SCHEMA)
        yield server.url()


def _connections(url: str) -> Counter[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND application_name LIKE 'pgqueue-worker%'"
            " GROUP BY 1"
        ).fetchall()
    return Counter(dict(rows))


def _idle_transactions_per_second(url: str, seconds: float = 5.0) -> float:
    """Commits per second on the server (polling claims, reaper turns): what an idle
    fleet costs. Printed for the record, not asserted: it depends on timing."""
    query = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        before = conn.execute(query).fetchone()[0]
        time.sleep(seconds)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        after = conn.execute(query).fetchone()[0]
    return (after - before) / seconds


def test_64_workers_share_one_database_within_their_connection_budget(fleet_server, tmp_path):
    args = [
        "--database-url",
        fleet_server,
        "--schema",
        SCHEMA,
        "--no-plugin-autoload",
        "--handlers",
        "scale_handlers:HANDLERS",
        "--concurrency",
        "2",
        "--poll-interval",
        "1",
        "--reap-interval",
        "1",
        "--log-level",
        "warning",
    ]
    env = environment(HERE)
    workers: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    peak: Counter[str] = Counter()

    def sample() -> Counter[str]:
        counts = _connections(fleet_server)
        for role, count in counts.items():
            peak[role] = max(peak[role], count)
        return counts

    try:
        for log_path in logs:
            workers.append(start_worker(args, env, log_path))
        wait_for(
            lambda: sample()["pgqueue-worker-listen"] == WORKERS,
            timeout=240,
            what="every worker to connect and LISTEN",
        )
        with Queue.connect(fleet_server, schema=SCHEMA, max_size=1) as queue:
            queue.enqueue_many(JobSpec("echo", {"n": n}) for n in range(JOBS))

            def all_succeeded() -> bool:
                sample()
                stats = {s.queue: s.counts for s in queue.stats()}
                return stats["default"]["succeeded"] == JOBS

            wait_for(all_succeeded, timeout=240, what="the fleet to run every job")
            jobs = queue.list(state=JobState.SUCCEEDED, limit=1000).jobs
        idle_rate = _idle_transactions_per_second(fleet_server)
    finally:
        stop(workers, timeout=120)

    print(f"peak connections of {WORKERS} workers by role: {dict(peak)}")
    print(f"transactions per second with the {WORKERS} workers idle: {idle_rate:.0f}")
    assert len(jobs) == JOBS
    assert all(job.attempts == 1 for job in jobs), "a job ran more than once"
    for role, per_worker in BUDGET.items():
        assert peak[role] <= per_worker * WORKERS, (role, peak[role])
    assert sum(peak[role] for role in BUDGET) <= sum(BUDGET.values()) * WORKERS
    assert peak[PROBE] <= WORKERS, peak[PROBE]
    assert set(peak) <= {*BUDGET, PROBE}, set(peak)
    exit_codes = [process.returncode for process in workers]
    assert exit_codes == [0] * WORKERS, "\n".join(
        log.read_text()[-2000:] for log, code in zip(logs, exit_codes, strict=True) if code
    )
