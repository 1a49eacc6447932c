"""The soak's samples: every few seconds, what the queue did and what it costs.

Each sample holds, for the window since the previous one that reached the database:
jobs finished and their rate, the p99 pickup latency of the jobs claimed (from the
audit trail, so every claim counts, not a sample of them), the depth of the queue by
state, open connections by application, each table's and its indexes' size and dead
tuples; and, from ``/proc``, the resident memory of every worker and API process by
pid. A sample is taken on a fresh connection with a short timeout: when the server is
down or does not answer, its database figures are recorded as missing (with why), never
carried over or made up, and the next sample's window covers the gap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue.errors import first_line
from pgqueue_bench.scenarios.soak.tasks import LIMITED_QUEUE
from pgqueue_bench.sql.queries import one_row, statement_in

SQL_FILE = "soak.sql"
MIB = 2**20
# Long enough for a loaded machine, short enough that a sample during an outage
# gives up well before the next one is due.
CONNECT_TIMEOUT_SECONDS = 3
STATEMENT_TIMEOUT_MS = 4000


def prepare(url: str, schema: str) -> None:
    """Add the index the window's pickup query needs to the audit trail of ``schema``."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement_in(SQL_FILE, "soak_audit_index", schema=sql.Identifier(schema)))


def rss_mib(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MiB (``VmRSS``), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) * 1024 / MIB, 2)
    except (OSError, ValueError, IndexError):
        return None
    return None  # a zombie has no VmRSS line


class Sampler:
    """Takes a sample every ``every`` seconds in a thread of its own, on the clock of
    its start (a slow sample does not shift the ones after it).

    ``processes`` returns the processes to measure now, as label -> pid; ``started``
    is the soak's ``time.monotonic()`` origin, so samples and faults share a time axis.
    """

    def __init__(
        self,
        url: str,
        schema: str,
        every: float,
        processes: Callable[[], dict[str, int]],
        started: float,
    ) -> None:
        self.url = url
        self.schema = schema
        self.every = every
        self.processes = processes
        self.started = started
        self.samples: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._last_id = 0
        self._last_now: datetime | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(60)

    def _statement(self, name: str) -> sql.Composed:
        return statement_in(SQL_FILE, name, schema=sql.Identifier(self.schema))

    def _database_figures(self) -> dict[str, Any]:
        """One sample's database figures; raises psycopg.Error when it cannot."""
        options = f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"
        with psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            options=options,
            application_name="pgqueue-soak-sampler",
        ) as conn:
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(
                self._statement("soak_window"),
                {"after": self._last_id, "limited_queue": LIMITED_QUEUE},
            )
            window = one_row(cur)
            cur.execute(self._statement("soak_depth"))
            depth = {row["state"]: row["jobs"] for row in cur.fetchall()}
            cur.execute(self._statement("soak_connections"))
            connections = {row["application"]: row["connections"] for row in cur.fetchall()}
            cur.execute(self._statement("soak_tables"), {"schema_name": self.schema})
            tables = {
                row["table_name"]: {
                    "table_mib": round(row["table_bytes"] / MIB, 3),
                    "index_mib": round(row["index_bytes"] / MIB, 3),
                    "live_tuples": row["live_tuples"],
                    "dead_tuples": row["dead_tuples"],
                }
                for row in cur.fetchall()
            }
        now = window["now"]
        seconds = (now - self._last_now).total_seconds() if self._last_now else None
        self._last_id, self._last_now = window["last_id"], now
        p99 = window["pickup_p99_seconds"]
        return {
            "at": now,
            "clock": "database",
            "window_seconds": round(seconds, 3) if seconds else None,
            "finished": window["finished"],
            "succeeded": window["succeeded"],
            "throughput_per_second": round(window["finished"] / seconds, 3) if seconds else None,
            "pickups": window["pickups"],
            "pickup_p99_seconds": round(float(p99), 4) if p99 is not None else None,
            "depth": {state: depth.get(state, 0) for state in ("waiting", "queued", "running")},
            "connections": {"total": sum(connections.values()), "by_application": connections},
            "tables": tables,
        }

    def take(self) -> dict[str, Any]:
        """One sample, now."""
        elapsed = round(time.monotonic() - self.started, 3)
        # Memory comes from /proc, so it is measured even while the server is down.
        memory = {label: rss_mib(pid) for label, pid in self.processes().items()}
        sample: dict[str, Any] = {"elapsed_seconds": elapsed, "missing": None}
        try:
            sample.update(self._database_figures())
        except psycopg.Error as exc:
            sample.update(
                at=datetime.now(UTC),
                clock="local",
                missing=f"{type(exc).__name__}: {first_line(exc)}",
            )
        sample["rss_mib"] = {label: mib for label, mib in memory.items() if mib is not None}
        return sample

    def _run(self) -> None:
        try:
            ticks = 0
            while True:
                ticks += 1
                due = self.started + ticks * self.every
                if self._stopped.wait(max(0.0, due - time.monotonic())):
                    return
                self.samples.append(self.take())
        except BaseException as exc:
            self.error = exc
