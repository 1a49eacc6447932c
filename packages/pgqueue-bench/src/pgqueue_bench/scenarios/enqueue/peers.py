"""The enqueue driver's peers: PgQueuer and procrastinate, each run from a virtualenv of
its own (``--peer NAME=PYTHON``) through the scripts in :data:`pgqueue_bench.peers.DRIVERS`,
on a fresh database; the check of the ``--peer`` options; and the peers' versions, for
the environment block. Their own processes, so that their dependencies never meet
pgqueue's.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from psycopg import sql

from pgqueue_bench.infra import database
from pgqueue_bench.peers import DRIVERS
from pgqueue_bench.scenarios.enqueue.outcome import Timing, count_rows, outcome
from pgqueue_bench.scenarios.enqueue.settings import (
    CASE_OVERHEAD_TIMEOUT,
    SCHEMA_PREFIX,
    Settings,
    Tools,
)

PEERS = ("pgqueuer", "procrastinate")
# Where each peer keeps a job it has not run yet: the rows to count.
PEER_TABLES = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate_jobs"}


def _run_peer_script(python: str, script: Path, *args: str, timeout: float) -> str:
    done = subprocess.run(
        [python, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=script.parent,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{script.name} {args[0]} exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return done.stdout


def peer_case(
    url: str, settings: Settings, tools: Tools, *, peer: str, batch: int
) -> dict[str, Any]:
    """Case ``<peer>-*``: the peer's setup script prepares a fresh database, then its
    enqueue script adds one job (``batch`` 1) or ``batch`` jobs per call and prints
    what it timed; the run's figures, verified against the peer's job table."""
    python = tools.peer_pythons[peer]
    timeout = settings.warmup + settings.seconds + CASE_OVERHEAD_TIMEOUT
    with database.fresh_database(url, f"{SCHEMA_PREFIX}_{peer}") as peer_url:
        _run_peer_script(
            python, DRIVERS / f"peer_{peer}.py", "setup", "--database-url", peer_url,
            timeout=timeout,
        )  # fmt: skip
        printed = _run_peer_script(
            python,
            DRIVERS / f"enqueue_{peer}.py",
            "--database-url", peer_url,
            "--batch-size", str(batch),
            "--seconds", str(settings.seconds),
            "--warmup", str(settings.warmup),
            timeout=timeout,
        )  # fmt: skip
        timing = Timing(**json.loads(printed.strip().splitlines()[-1]))
        return outcome(timing, count_rows(peer_url, sql.Identifier(PEER_TABLES[peer])))


def peer_pythons(pairs: Sequence[str]) -> dict[str, str]:
    """The Python of each ``--peer NAME=PYTHON``, by peer, made absolute. An unknown
    peer or a Python that is not executable is a usage error."""
    pythons = {}
    for pair in pairs:
        name, sep, python = pair.partition("=")
        if not sep or name not in PEERS:
            raise click.BadParameter(
                f"{pair!r}: expected NAME=PYTHON with NAME one of {', '.join(PEERS)}",
                param_hint="--peer",
            )
        # Absolute but not resolved: a virtualenv's python is a link to the base one.
        pythons[name] = os.path.abspath(python)
        if not os.access(pythons[name], os.X_OK):
            raise click.BadParameter(f"{python} is not an executable Python", param_hint="--peer")
    return pythons


def peer_versions(tools: Tools) -> dict[str, str | None]:
    """Each given peer's version, as its own virtualenv reports it."""
    versions: dict[str, str | None] = {}
    for peer, python in tools.peer_pythons.items():
        printed = _run_peer_script(
            python, DRIVERS / f"peer_{peer}.py", "version", timeout=CASE_OVERHEAD_TIMEOUT
        )
        versions[peer] = json.loads(printed.strip().splitlines()[-1])[peer]
    return versions
