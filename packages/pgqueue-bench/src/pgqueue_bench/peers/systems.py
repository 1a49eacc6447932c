"""The systems the side-by-side runs compare: pgqueue, each peer with its documented
settings, and the pgqueue variants that run only when asked (limits that never bind, a
baseline build, jobs with partition keys); each one is a driver script
(``drivers/peer_<name>.py``) under a Python of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgqueue_bench.peers import DRIVERS


@dataclass(frozen=True)
class System:
    """One queue under test, with the settings it runs with."""

    name: str
    peer: str
    settings: dict[str, str] = field(default_factory=dict)
    """The worker's settings (``work --setting``)."""
    python: str = sys.executable
    enqueue_settings: dict[str, str] = field(default_factory=dict)
    """How its jobs are made (``enqueue --setting``): pgqueue's ``partition_keys``."""

    @property
    def script(self) -> Path:
        return DRIVERS / f"peer_{self.peer}.py"

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in self.name.lower())

    def command(self, *args: str) -> list[str]:
        return [self.python, str(self.script), *args]

    def run(self, *args: str, timeout: float = 300) -> str:
        """Run one subcommand to completion; return its output."""
        done = subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, cwd=DRIVERS
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} {args[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def report(self, url: str, *, latencies: bool = False) -> dict[str, Any]:
        args = ["report", "--database-url", url] + (["--latencies"] if latencies else [])
        reported: dict[str, Any] = json.loads(self.run(*args).strip().splitlines()[-1])
        return reported

    def setting_args(self) -> list[str]:
        return _setting_args(self.settings)

    def enqueue_setting_args(self) -> list[str]:
        return _setting_args(self.enqueue_settings)


def _setting_args(settings: dict[str, str]) -> list[str]:
    return [arg for name, value in settings.items() for arg in ("--setting", f"{name}={value}")]


# Limits configured on the queue but far above what a run reaches: what the claim
# pays for reading and keeping them, not what they hold back.
UNBOUND_CONCURRENCY_LIMIT = 10_000
UNBOUND_RATE_LIMIT = 1_000_000
# The same per partition key: a key holds a few dozen of a run's jobs.
UNBOUND_PARTITION_CONCURRENCY_LIMIT = 10_000
UNBOUND_PARTITION_RATE_LIMIT = 1_000_000
PARTITION_KEYS = 100


def systems(pythons: dict[str, str]) -> list[System]:
    """pgqueue with its default worker, and each peer with its documented throughput
    settings; PgQueuer also with the larger batch its tuning guide suggests for
    short jobs, so the comparison is against its best documented configuration.
    (A peer whose Python was not given has an empty one; it cannot be chosen.)"""
    return [
        System("pgqueue", "pgqueue"),
        System("procrastinate", "procrastinate", python=pythons.get("procrastinate", "")),
        System("pgqueuer", "pgqueuer", python=pythons.get("pgqueuer", "")),
        System(
            "pgqueuer batch 100",
            "pgqueuer",
            {"batch_size": "100"},
            python=pythons.get("pgqueuer", ""),
        ),
    ]


def pgqueue_variants(baseline: tuple[str, str] | None) -> list[System]:
    """The systems that run only when asked: today's pgqueue on a queue with a
    concurrency limit or a rate limit that never binds, and, given ``(label,
    python)``, the pgqueue installed under that Python as "pgqueue LABEL"."""
    variants = [
        System(
            "pgqueue concurrency-limited",
            "pgqueue",
            {"queue_concurrency_limit": str(UNBOUND_CONCURRENCY_LIMIT)},
        ),
        System("pgqueue rate-limited", "pgqueue", {"queue_rate_limit": str(UNBOUND_RATE_LIMIT)}),
    ]
    if baseline:
        label, python = baseline
        variants.append(System(f"pgqueue {label}", "pgqueue", python=python))
    return variants


def partition_variants(keys: int = PARTITION_KEYS) -> list[System]:
    """The systems of the drain with partition keys, which run only when asked: today's
    pgqueue with its jobs spread over ``keys`` partition keys, with fair share only,
    and with a partition concurrency limit or a partition rate limit that never binds."""
    spread = {"partition_keys": str(keys)}
    return [
        System(f"pgqueue {keys} keys", "pgqueue", enqueue_settings=spread),
        System(
            f"pgqueue {keys} keys partition-limited",
            "pgqueue",
            {"queue_partition_concurrency_limit": str(UNBOUND_PARTITION_CONCURRENCY_LIMIT)},
            enqueue_settings=spread,
        ),
        System(
            f"pgqueue {keys} keys partition-rate-limited",
            "pgqueue",
            {"queue_partition_rate_limit": str(UNBOUND_PARTITION_RATE_LIMIT)},
            enqueue_settings=spread,
        ),
    ]


def described_settings(
    names: list[str], sleep_ms: float, keys: int = PARTITION_KEYS
) -> dict[str, str]:
    """What each of the standard systems and of the asked-for ones among ``names`` runs
    with, for the results file (the partition-key systems: those of ``keys`` keys); with
    ``sleep_ms``, the async handler each one awaits."""
    if sleep_ms:
        sleep = f"asyncio.sleep({sleep_ms / 1000:g})"
        handler, peer_handler = f"async handler awaiting {sleep}", f" awaiting {sleep}"
    else:
        handler, peer_handler = "sync no-op handler", ""
    described = {
        "pgqueue": "pgqueue worker --burst with its defaults and --log-level warning "
        f"(no log line per job), {handler}, connected before the start barrier "
        "as every peer is",
        "procrastinate": f"async task{peer_handler}, run_worker(concurrency=30), "
        "LISTEN/NOTIFY on, PsycopgConnector (its concurrency how-to)",
        "pgqueuer": f"async entrypoint{peer_handler} (no concurrency_limit: its default), "
        "AsyncpgDriver, durable tables, batch_size=10 (its default and its benchmark tool's)",
        "pgqueuer batch 100": "as pgqueuer, batch_size=100 (its tuning guide: a larger "
        "batch for short jobs)",
    }
    asked_for = {
        "pgqueue concurrency-limited": "as pgqueue, on a queue whose concurrency_limit is "
        f"{UNBOUND_CONCURRENCY_LIMIT} (set with Queue.update_queue before the start barrier)",
        "pgqueue rate-limited": f"as pgqueue, on a queue whose rate_limit is "
        f"{UNBOUND_RATE_LIMIT:g} jobs/s (set with Queue.update_queue before the start barrier)",
    }
    asked_for.update(_described_keys(keys))
    described.update({name: text for name, text in asked_for.items() if name in names})
    return described


def _described_keys(keys: int) -> dict[str, str]:
    """What each system of :func:`partition_variants` of ``keys`` keys runs with."""
    fair, limited, rate_limited = (system.name for system in partition_variants(keys))
    spread = (
        f"as pgqueue, its jobs spread over {keys} partition keys in turn (claimed round-robin "
        "by key: fair share)"
    )
    return {
        fair: spread,
        limited: f"{spread}, on a queue whose partition_concurrency_limit is "
        f"{UNBOUND_PARTITION_CONCURRENCY_LIMIT} per key (set with Queue.update_queue before "
        "the start barrier)",
        rate_limited: f"{spread}, on a queue whose partition_rate_limit is "
        f"{UNBOUND_PARTITION_RATE_LIMIT:g} jobs/s per key (set with Queue.update_queue before "
        "the start barrier)",
    }
