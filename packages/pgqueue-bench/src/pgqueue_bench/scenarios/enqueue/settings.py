"""What every case of the enqueue driver runs with: the queue, task and schema prefix
of its jobs, the file of its raw statements, the run's :class:`Settings` (from the
command's options) and the :class:`Tools` found for the optional cases.

A leaf of the driver: the producers, the HTTP and peer cases and the command all read
these, and the command imports them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pgqueue_bench import handlers

QUEUE_NAME = "bench_enqueue"
TASK = handlers.NOOP_TASK
SCHEMA_PREFIX = "bench_enqueue"
STATEMENTS = "enqueue.sql"
# On top of a case's own time: connecting, starting the API, a peer's interpreter.
CASE_OVERHEAD_TIMEOUT = 180.0


@dataclass(frozen=True)
class Settings:
    """One enqueue run's shape."""

    seconds: float = 5.0
    warmup: float = 1.0
    connections: int = 16
    batch_size: int = 1000
    http_batch_size: int = 100
    api_workers: int = 2

    @property
    def wrk_seconds(self) -> int:
        """wrk takes whole seconds."""
        return max(1, round(self.seconds))

    @property
    def wrk_warmup_seconds(self) -> int:
        return max(1, round(self.warmup))


@dataclass(frozen=True)
class Tools:
    """What the optional cases need, found once per run."""

    wrk: str | None = None
    peer_pythons: dict[str, str] = field(default_factory=dict)
