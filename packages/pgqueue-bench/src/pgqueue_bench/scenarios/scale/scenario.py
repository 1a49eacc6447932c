"""What the scale driver measures with: the queues and the history it builds, the
default history sizes, the private cluster's settings, the targets, and
:class:`Scenario`, the shape of one invocation.

Apart from the command (:mod:`pgqueue_bench.scenarios.scale.driver`) because every part
of the driver reads them and the command imports every part: kept there, they would make
a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUE_NAME = "scale"
OTHER_QUEUES = ("emails", "reports")
# Whole days of history before the day of the first load (which holds the rest).
HISTORY_DAYS = 30
COPY_CHUNK_ROWS = 200_000
ENQUEUE_BATCH = 5_000

SIZES = (0, 100_000, 1_000_000, 5_000_000)
QUICK_SIZES = (0, 100_000)

# PostgreSQL's defaults, except room for the clients: the figures should be what an
# untuned server gives.
PRIVATE_SERVER_SETTINGS = {"max_connections": "100", "shared_buffers": "128MB"}

# The target: with the largest history, at least 95% of the throughput without history.
THROUGHPUT_TOLERANCE = 0.05
METRICS_BUDGET_MS = 50.0
# Runnable jobs the soak's producer keeps queued, so the clients never run dry.
SOAK_BACKLOG = 5_000


@dataclass(frozen=True)
class Scenario:
    """The shape of the scale runs."""

    sizes: tuple[int, ...] = SIZES
    jobs: int = 20_000
    clients: int = 2
    batch: int = 10
    repeats: int = 5
    scrapes: int = 200
    soak_seconds: float = 600.0
    soak_window: float = 10.0
    timeout: float = 1800.0
