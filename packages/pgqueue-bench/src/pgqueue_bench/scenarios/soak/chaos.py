"""The soak's chaos loop: a fault from the fault suite's repertoire, chosen at random
(seeded), after every quiet spell of a random length.

The faults are those the fault scenarios inject one at a time (``tests/faults``), here
against a running mix instead of a scripted one:

- ``server_crash``: ``pg_ctl stop -m immediate``, then start (crash recovery);
- ``backend_kill``: one worker backend SIGKILLed, so the postmaster resets every
  backend and recovers;
- ``terminate_backends``: ``pg_terminate_backend`` of every worker connection;
- ``read_only``: the primary made read-only for 5-15 s, then writable again;
- ``worker_sigkill``: a worker SIGKILLed, and a replacement started;
- ``worker_sigstop``: a worker frozen past its lease, then continued;
- ``blackhole``: the network namespace of the isolated worker loses its cable past the
  lease (every packet dropped), then gets it back.

Each fault is recorded with its start and end on the database clock (the local clock,
said so, when the database cannot answer at that moment) and on the soak's own time
axis; a fault is undone in a ``finally``, so a failure to inject never leaves the
cluster read-only or a worker frozen.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

from pgqueue_bench.infra.fleet import WorkerFleet
from pgqueue_bench.infra.netns import IsolatedNetwork
from pgqueue_bench.infra.servers import PrivateServer, ServerError
from pgqueue_bench.sql.queries import statement_in

FAULT_KINDS = (
    "server_crash",
    "backend_kill",
    "terminate_backends",
    "read_only",
    "worker_sigkill",
    "worker_sigstop",
    "blackhole",
)
WORKER_APPLICATIONS = ("pgqueue-worker", "pgqueue-worker-heartbeat", "pgqueue-worker-listen")
# Past the lease by this much, so that the reaper has certainly taken the jobs back.
PAST_LEASE_SECONDS = 5.0
READ_ONLY_SECONDS = (5.0, 15.0)


def database_clock(url: str) -> tuple[datetime, str]:
    """Now on the database clock, or on the local one when the database cannot say."""
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            now = conn.execute(statement_in("soak.sql", "soak_now")).fetchone()[0]  # type: ignore[index]
            return now, "database"
    except psycopg.Error:
        return datetime.now(UTC), "local"


class Chaos:
    """Injects faults into one soak's cluster and workers.

    ``kinds`` narrows the faults to some of :data:`FAULT_KINDS` (default: all this
    run can inject); ``applications`` are the ``application_name`` of the connections
    that ``terminate_backends`` and ``backend_kill`` aim at (default: the worker's)."""

    def __init__(
        self,
        server: PrivateServer,
        fleet: WorkerFleet,
        *,
        lease_seconds: float,
        rng: random.Random,
        started: float,
        isolated: WorkerFleet | None = None,
        network: IsolatedNetwork | None = None,
        kinds: tuple[str, ...] | None = None,
        applications: tuple[str, ...] = WORKER_APPLICATIONS,
    ) -> None:
        unknown = set(kinds or ()) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))}")
        self.server = server
        self.fleet = fleet
        self.lease_seconds = lease_seconds
        self.rng = rng
        self.started = started
        self.isolated = isolated
        self.network = network
        self.chosen_kinds = kinds
        self.applications = applications
        self.faults: list[dict[str, Any]] = []

    @property
    def kinds(self) -> tuple[str, ...]:
        """The faults this run can inject (those chosen, if some were): the blackhole
        needs the isolated worker."""
        kinds = self.chosen_kinds or FAULT_KINDS
        if self.network is None or self.isolated is None:
            return tuple(kind for kind in kinds if kind != "blackhole")
        return kinds

    @property
    def longest_fault_seconds(self) -> float:
        """How long the longest fault lasts (a crash's recovery takes less)."""
        return max(self.lease_seconds + PAST_LEASE_SECONDS, READ_ONLY_SECONDS[1])

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def inject(self, kind: str) -> dict[str, Any]:
        """Inject one fault, undo it, and return its record."""
        inject: Callable[[], dict[str, Any]] = getattr(self, f"_{kind}")
        started_at, start_clock = database_clock(self.server.url())
        record: dict[str, Any] = {
            "kind": kind,
            "started_at": started_at,
            "start_clock": start_clock,
            "start_elapsed_seconds": self._elapsed(),
        }
        try:
            record["details"] = inject()
            record["error"] = None
        except (ServerError, subprocess.SubprocessError, OSError, RuntimeError) as exc:
            record["details"] = {}
            record["error"] = f"{type(exc).__name__}: {exc}"
        record["end_elapsed_seconds"] = self._elapsed()
        ended_at, end_clock = database_clock(self.server.url())
        record.update(ended_at=ended_at, end_clock=end_clock)
        record["seconds"] = round(
            record["end_elapsed_seconds"] - record["start_elapsed_seconds"], 3
        )
        self.faults.append(record)
        return record

    def run(
        self,
        until: float,
        every: tuple[float, float],
        report: Callable[[str], object] = lambda line: None,
    ) -> None:
        """Inject faults until ``until`` (monotonic), a quiet spell of ``every`` seconds
        (a random length in that range) before each; ``report`` gets a line per fault.
        A fault starts only if, at its longest, it leaves the shortest spell before the
        end, so the last one has time to recover under load."""
        shortest, longest = every
        while True:
            due = time.monotonic() + self.rng.uniform(shortest, longest)
            if due + self.longest_fault_seconds + shortest > until:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            fault = self.inject(self.rng.choice(self.kinds))
            report(
                f"{fault['start_elapsed_seconds']:8.1f} s  {fault['kind']} for "
                f"{fault['seconds']:.1f} s {fault['details'] or ''}{fault['error'] or ''}"
            )

    # -- the faults -----------------------------------------------------------------------

    def _server_crash(self) -> dict[str, Any]:
        down = time.monotonic()
        self.server.stop("immediate")
        self.server.start()
        return {"seconds_to_accept_connections": round(time.monotonic() - down, 3)}

    def _backend_kill(self) -> dict[str, Any]:
        candidates = [
            (pid, name) for name in self.applications for pid in self.server.backend_pids(name)
        ]
        if not candidates:
            raise RuntimeError("no worker backend to kill")
        pid, name = self.rng.choice(candidates)
        down = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        # The postmaster resets every backend and recovers; wait until it accepts again.
        time.sleep(0.5)
        self.server.wait_accepting(120)
        return {
            "backend_pid": pid,
            "application": name,
            "seconds_to_accept_connections": round(time.monotonic() - down, 3),
        }

    def _terminate_backends(self) -> dict[str, Any]:
        terminated = {name: self.server.terminate_backends(name) for name in self.applications}
        return {"terminated": terminated}

    def _read_only(self) -> dict[str, Any]:
        seconds = round(self.rng.uniform(*READ_ONLY_SECONDS), 1)
        try:
            self.server.set_read_only(True)
            time.sleep(seconds)
        finally:
            self.server.set_read_only(False)
        return {"read_only_seconds": seconds}

    def _a_host_worker(self) -> subprocess.Popen[bytes]:
        running = self.fleet.running()
        if not running:
            raise RuntimeError("no running worker")
        return self.rng.choice(running)

    def _worker_sigkill(self) -> dict[str, Any]:
        victim = self._a_host_worker()
        self.fleet.kill(victim)
        replacement = self.fleet.start_one()
        self.fleet.wait_serving([replacement])
        return {"killed_pid": victim.pid, "replacement_pid": replacement.pid}

    def _worker_sigstop(self) -> dict[str, Any]:
        victim = self._a_host_worker()
        seconds = self.lease_seconds + PAST_LEASE_SECONDS
        victim.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            victim.send_signal(signal.SIGCONT)
        return {"pid": victim.pid, "frozen_seconds": seconds}

    def _blackhole(self) -> dict[str, Any]:
        assert self.network is not None and self.isolated is not None
        running = self.isolated.running()
        seconds = self.lease_seconds + PAST_LEASE_SECONDS
        self.network.pull_cable()
        try:
            time.sleep(seconds)
        finally:
            self.network.plug_cable()
        return {"isolated_pids": [p.pid for p in running], "cable_out_seconds": seconds}
