"""Stopping the processes a driver started: the way every one of them ends."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any


def stop_processes(processes: Sequence[subprocess.Popen[Any]], timeout: float) -> list[int]:
    """SIGTERM every one of ``processes`` still running, give them ``timeout`` seconds
    in all to exit (each at least one more second once that has passed), then SIGKILL
    and reap any still running. Returns their exit codes, in order."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return [process.returncode for process in processes]
