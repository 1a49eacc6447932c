"""The worker processes of one system in a side-by-side run, started behind a barrier
so that they all begin at once, and what they report when they exit.
"""

from __future__ import annotations

import select
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

from pgqueue_bench.peers import DRIVERS
from pgqueue_bench.peers.drivers import peerlib
from pgqueue_bench.peers.systems import System


class Workers:
    """W ``work`` processes of one system, started behind a barrier."""

    def __init__(
        self,
        system: System,
        url: str,
        count: int,
        folder: Path,
        *,
        drain: bool,
        sleep_ms: float = 0.0,
    ) -> None:
        self.seen_files = [folder / f"seen-{n}.txt" for n in range(count)]
        self.processes: list[subprocess.Popen[str]] = []
        for n, seen in enumerate(self.seen_files):
            log = (folder / f"worker-{n}.log").open("w")
            args = ["work", "--database-url", url, "--seen-file", str(seen), *system.setting_args()]
            if sleep_ms:
                args += ["--sleep-ms", f"{sleep_ms:g}"]
            self.processes.append(
                subprocess.Popen(
                    system.command(*args, *(["--drain"] if drain else [])),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    cwd=DRIVERS,
                )
            )
            log.close()
        self.folder = folder

    def release(self, timeout: float = 120) -> None:
        """Wait until every process said ready, then let them all go at once."""
        self.wait_until_ready(timeout)
        self.go()

    def wait_until_ready(self, timeout: float = 120) -> None:
        """Wait until every process has connected and said ready."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or process.poll() is not None:
                    raise RuntimeError(f"a worker did not get ready:\n{self.log_tail()}")
                _, said = _pipes(process)
                readable, _, _ = select.select([said], [], [], remaining)
                if readable and said.readline().strip() == "ready":
                    break

    def go(self) -> None:
        """Open the start barrier: every ready process starts at once."""
        for process in self.processes:
            told, _ = _pipes(process)
            told.write("go\n")
            told.flush()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.wait(max(0.1, deadline - time.monotonic()))
        failed = [p.returncode for p in self.processes if p.returncode != 0]
        if failed:
            raise RuntimeError(f"workers exited with {failed}:\n{self.log_tail()}")

    def stop(self, timeout: float = 60) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        self.wait(timeout)

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    def seen(self) -> list[int]:
        numbers: list[int] = []
        for path in self.seen_files:
            if path.exists():
                numbers += [int(line) for line in path.read_text().split()]
        return numbers

    def cpu_seconds(self) -> float | None:
        """The CPU seconds the processes used from their first job (each writes its own
        at exit, see ``peerlib.write_seen``), or None if one did not."""
        paths = [peerlib.cpu_path(path) for path in self.seen_files]
        if not all(path.exists() for path in paths):
            return None
        return sum(float(path.read_text()) for path in paths)

    def log_tail(self) -> str:
        return "\n".join(
            path.read_text()[-1500:] for path in sorted(self.folder.glob("worker-*.log"))
        )


def _pipes(process: subprocess.Popen[str]) -> tuple[IO[str], IO[str]]:
    """The stdin and stdout of a worker process, both of which :class:`Workers` pipes."""
    if process.stdin is None or process.stdout is None:
        raise RuntimeError("a worker process was started without its pipes")
    return process.stdin, process.stdout
