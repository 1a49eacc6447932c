"""Real ``pgqueue`` processes started by the tests: the console script of the
environment running the tests, the environment in which a worker finds a test
folder's handlers, and workers whose output goes to a log file."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from pgqueue_bench.infra.processes import stop_processes


def pgqueue_command() -> list[str]:
    """The ``pgqueue`` console script of the environment running the tests (the one
    beside its Python, so that the virtualenv need not be activated)."""
    script = Path(sys.executable).parent / "pgqueue"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from pgqueue.cli import main; main()"]


def python_path(folder: Path) -> str:
    """PYTHONPATH with ``folder`` first: a worker imports a test folder's handlers."""
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def environment(folder: Path, **extra: str) -> dict[str, str]:
    """The tests' environment for a process that imports from ``folder``, plus
    ``extra``. Output is unbuffered, so a log read mid-test holds every line so far."""
    return {**os.environ, "PYTHONPATH": python_path(folder), "PYTHONUNBUFFERED": "1", **extra}


def start_worker(
    args: Iterable[str], env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``pgqueue worker`` with ``args``; its stdout and stderr go to ``log_path``.
    It gets a session of its own, so a Ctrl-C meant for pytest does not reach it and
    the test's clean-up decides how it stops."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [*pgqueue_command(), "worker", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(processes: Iterable[subprocess.Popen[bytes]], timeout: float = 60.0) -> list[int]:
    """SIGTERM each process still running and give them ``timeout`` s in all to exit;
    SIGKILL those that have not. Returns their exit codes."""
    return stop_processes(list(processes), timeout)
