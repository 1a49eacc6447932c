"""``results/faults.json``: every scenario's figures, per PostgreSQL major version.

Each test process collects the figures of the scenarios it ran and merges them into the
file when its session ends, under a lock, so the processes of ``pytest -n 2`` (and a run
on PostgreSQL 15 beside one on 18) each add their own scenarios without losing the
others'. A scenario that ran again replaces its earlier figures; the ones that did not
run keep theirs.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pgqueue_bench import results
from pgqueue_bench.infra import environment
from pgqueue_bench.infra.binaries import Binaries

RESULTS_NAME = "faults"
REPOSITORY_RESULTS = Path(__file__).resolve().parents[2] / "results"

# What each scenario does to the queue, in a line: stored with its figures as "fault", so
# results/faults.json explains itself and the README's table says what each row broke.
# Markdown, since that table is where it is read.
FAULTS: dict[str, str] = {
    "01-server-crash": (
        "PostgreSQL crash (`pg_ctl stop -m immediate`, start) mid claims, acks and enqueues"
    ),
    "02-backend-killed": "one backend killed with `kill -9`: the postmaster resets every connection",
    "02-connections-terminated": (
        "`pg_terminate_backend` of a worker's heartbeat, pooled and LISTEN connections"
    ),
    "03-failover-to-standby": (
        "primary stopped (`-m immediate`), synchronous standby promoted; one multi-host URL "
        "with `target_session_attrs=read-write`"
    ),
    "03-read-only-primary": (
        "primary turned read-only (`default_transaction_read_only = on`, reload), then writable"
    ),
    "04-network-blackhole": (
        "a worker's and the API's path blackholed past the lease, then reset (RST)"
    ),
    "04-cable-pulled": (
        "a worker's cable pulled (its network namespace's loopback down) past the lease, "
        "then plugged in"
    ),
    "05-disk-full": "the queue's tablespace (a tmpfs) filled to the last byte, then space freed",
    "06-pool-exhausted": "handlers hold every connection of the worker's pool past the lease",
    "06-hung-table-lock": (
        "another session holds `LOCK TABLE jobs`, with a `statement_timeout` on the database"
    ),
    "07-stalled-worker": "a worker holding jobs frozen (SIGSTOP) past its lease, then continued",
    "07-reaper-ack-race": "a reaper and two late ackers racing for the same just-expired leases",
    "08-deadlock-hunt": (
        "batched acks and claims, heartbeats, reaper, pruner, cancels, retries and frozen "
        "workers all at once (`deadlock_timeout = 100ms`)"
    ),
    "09-ids-past-2-31": "job ids past 2^31 through workers, heartbeats, cancel, retry and the API",
    "09-attempts-at-integer-limit": "attempt counts at the integer limit (2^31-1)",
    "09-undecodable-payloads": (
        "payloads a handler rejects, and JSON nested deeper than Python can decode"
    ),
    "09-poison-rows-under-a-fleet": (
        "rows Python cannot load (a 5,001-digit number, nesting past its recursion limit, a "
        "number a float reads as Infinity) or pgqueue would not store (300 levels deep), "
        "queued and held by vanished workers, among a fleet's jobs"
    ),
    "10-server-timeouts": (
        "`statement_timeout`, `idle_in_transaction_session_timeout` (17+: "
        "`transaction_timeout`) of 1 s on the server"
    ),
    "11-patroni-switchover": (
        "`patronictl switchover --force` to the synchronous replica of a Patroni cluster "
        "(etcd, `synchronous_mode: true`); one multi-host URL with "
        "`target_session_attrs=read-write`"
    ),
    "11-patroni-failover": (
        "`patronictl failover --force` to the synchronous replica of a Patroni cluster; "
        "one multi-host URL with `target_session_attrs=read-write`"
    ),
    "12-crash-reject-unserved": (
        "PostgreSQL crash (`pg_ctl stop -m immediate`, start) while producers post to an API "
        "started with `--reject-unserved-tasks`: its unlogged worker registry comes back "
        "empty; a 422 (lost at the producer, which does not retry a 4xx) counts as lost"
    ),
    "11-patroni-primary-killed": (
        "the Patroni primary's postmaster killed (SIGKILL), Patroni restarts it in place; "
        "one multi-host URL with `target_session_attrs=read-write`"
    ),
    "13-producer-holds-dependents": (
        "producers enqueue dependents of running jobs in transactions held open for three "
        "leases (a quarter rolled back)"
    ),
    "14-partition-limit-race": (
        "8 workers claiming jobs of 4 partition keys at once under "
        "`partition_concurrency_limit = 2`"
    ),
    "14-partition-killed-worker": (
        "a worker SIGKILLed holding the only slot of a key (`partition_concurrency_limit = 1`)"
    ),
    "14-partition-restart-fast": (
        "PostgreSQL restarted (`pg_ctl stop -m fast`, start) while workers run jobs of "
        "3 keys under `partition_concurrency_limit = 2`"
    ),
    "14-partition-restart-immediate": (
        "PostgreSQL crash (`pg_ctl stop -m immediate`, start) while workers run jobs of "
        "3 keys under `partition_concurrency_limit = 2`"
    ),
}


def server_version(binaries: Binaries) -> str:
    """``PostgreSQL 18.4`` for the binaries the private clusters run."""
    out = subprocess.run(
        [binaries.program("postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    # "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)" -> "PostgreSQL 15.20"
    return "PostgreSQL " + out.split(")", 1)[1].split()[0]


class FaultResults:
    """The figures of the scenarios this test process ran, on ``binaries``."""

    def __init__(self, binaries: Binaries) -> None:
        self.binaries = binaries
        self.scenarios: dict[str, dict[str, Any]] = {}

    def add(self, scenario: str, test: str, figures: dict[str, Any]) -> None:
        """Record one scenario's figures (``test`` is the pytest node id that made them),
        with the line of :data:`FAULTS` that says what the scenario does."""
        if scenario not in FAULTS:
            # Fail the scenario that made them rather than publish figures nobody can read.
            raise KeyError(
                f"{scenario!r} has no description in FAULTS (tests/faults/fault_results.py)"
            )
        self.scenarios[scenario] = {
            "test": test,
            "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "fault": FAULTS[scenario],
            **figures,
        }

    def write(self, directory: Path | str | None = None) -> Path | None:
        """Merge this process's figures into ``<directory>/faults.json`` (default:
        ``PGQUEUE_RESULTS_DIR``, else the repository's ``results/``)."""
        if not self.scenarios:
            return None
        folder = results.results_dir(
            directory or os.environ.get("PGQUEUE_RESULTS_DIR") or REPOSITORY_RESULTS
        )
        folder.mkdir(parents=True, exist_ok=True)
        lock = os.open(folder, os.O_RDONLY)  # the directory itself: the lock leaves no file
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            document = results.read(RESULTS_NAME, folder) or {}
            versions = document.get("postgresql", {})
            entry = versions.setdefault(str(self.binaries.major), {"scenarios": {}})
            entry["server"] = f"private clusters, {self.binaries.label}"
            entry["version"] = server_version(self.binaries)
            entry["scenarios"] = dict(sorted({**entry["scenarios"], **self.scenarios}.items()))
            merged = {
                "benchmark": RESULTS_NAME,
                "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "description": (
                    "Fault-injection scenarios (tests/faults): per scenario, the fault "
                    "injected (fault), the acknowledged enqueues (jobs), those lost, jobs "
                    "completed twice (duplicates), handler runs beyond the first "
                    "(redeliveries, allowed by at-least-once), and seconds on the database "
                    "clock from the fault's removal to the first finished job "
                    "(recovery_seconds) and the longest gap between finished jobs "
                    "(pause_seconds)."
                ),
                "environment": {
                    "machine": environment.machine(),
                    "packages": environment.package_versions(),
                },
                "postgresql": dict(sorted(versions.items())),
            }
            return results.write(RESULTS_NAME, json.loads(json.dumps(merged, default=str)), folder)
        finally:
            os.close(lock)
