"""Real ``pgqueue worker`` processes, started, killed and replaced by the drivers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pgqueue import JobSpec, Queue
from pgqueue_bench import handlers
from pgqueue_bench.infra.processes import stop_processes
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.verdict import observe
from pgqueue_bench.verdict.observe import wait_for

HANDLERS_SPEC = "pgqueue_bench.handlers:HANDLERS"
WARMUP_PAUSE = 0.2


def pgqueue_command() -> list[str]:
    """The ``pgqueue`` command of this installation (the script next to the Python
    running us, so a virtualenv need not be activated)."""
    beside = Path(sys.executable).parent / "pgqueue"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("pgqueue")
    if found:
        return [found]
    return [sys.executable, "-c", "from pgqueue.cli import main; main()"]


@dataclass(frozen=True)
class WorkerSettings:
    """The ``pgqueue worker`` flags a driver runs with; None leaves the default."""

    queue: str = "default"
    concurrency: int | None = None
    prefetch: int | None = None
    lease_seconds: float | None = None
    heartbeat_seconds: float | None = None
    poll_interval: float | None = None
    listen: bool = True
    reap_interval: float | None = None
    claim_mode: str | None = None
    retry_base: float | None = None
    retry_cap: float | None = None
    burst: bool = False
    shutdown_timeout: float | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def arguments(self) -> list[str]:
        """The command-line flags for these settings."""
        args = ["--queue", self.queue, "--handlers", HANDLERS_SPEC, "--log-format", "json"]
        optional = {
            "--concurrency": self.concurrency,
            "--prefetch": self.prefetch,
            "--lease-seconds": self.lease_seconds,
            "--heartbeat-seconds": self.heartbeat_seconds,
            "--poll-interval": self.poll_interval,
            "--reap-interval": self.reap_interval,
            "--claim-mode": self.claim_mode,
            "--retry-base": self.retry_base,
            "--retry-cap": self.retry_cap,
            "--shutdown-timeout": self.shutdown_timeout,
        }
        for flag, value in optional.items():
            if value is not None:
                args += [flag, str(value)]
        if not self.listen:
            args.append("--no-listen")
        if self.burst:
            args.append("--burst")
        return [*args, *self.extra_args]


class WorkerFleet:
    """Worker processes on one schema. Each writes its log to ``log_dir``; the
    recording handler finds the database and ``log_dir`` in its environment.

    ``prefix`` goes before each command line (``nsenter`` into a network namespace,
    say); ``environment`` is added to each worker's.

    Use as a context manager: every process still running at the end is stopped
    (SIGTERM, then SIGKILL after ``stop_timeout``)."""

    def __init__(
        self,
        url: str,
        schema: str,
        settings: WorkerSettings,
        log_dir: Path,
        *,
        stop_timeout: float = 30,
        prefix: tuple[str, ...] = (),
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        self.schema = schema
        self.settings = settings
        self.log_dir = log_dir
        self.stop_timeout = stop_timeout
        self.prefix = prefix
        self.extra_environment = dict(environment or {})
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log_paths: dict[int, Path] = {}
        """Each worker's log, by pid."""
        self.started = 0
        log_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        """The full command line of one worker."""
        return [
            *self.prefix,
            *pgqueue_command(),
            "worker",
            "--database-url",
            self.url,
            "--schema",
            self.schema,
            *self.settings.arguments(),
        ]

    def environment(self) -> dict[str, str]:
        """The environment of one worker: ours plus where the handlers record."""
        return {
            **os.environ,
            handlers.DATABASE_URL_VARIABLE: self.url,
            handlers.SCHEMA_VARIABLE: self.schema,
            handlers.RUN_DIR_VARIABLE: str(self.log_dir),
            "PYTHONUNBUFFERED": "1",
            **self.extra_environment,
        }

    def start_one(self) -> subprocess.Popen[bytes]:
        """Start one more worker."""
        self.started += 1
        log_path = self.log_dir / f"worker-{self.started}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the terminal is the driver's to handle
            )
        self.processes.append(process)
        self.log_paths[process.pid] = log_path
        return process

    def start(self, count: int) -> list[subprocess.Popen[bytes]]:
        """Start ``count`` workers."""
        return [self.start_one() for _ in range(count)]

    def running(self) -> list[subprocess.Popen[bytes]]:
        """The workers that have not exited."""
        return [p for p in self.processes if p.poll() is None]

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL one worker and reap it."""
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        process.wait()

    def wait_serving(
        self, processes: list[subprocess.Popen[bytes]] | None = None, timeout: float = 120.0
    ) -> None:
        """Wait until each of ``processes`` (default: all) has logged that it serves its
        queue: on a loaded machine a worker takes seconds to start, and a fault injected
        before would hit nothing. Raises RuntimeError, with the logs, if one exits."""
        chosen = self.processes if processes is None else processes

        def serving() -> bool:
            if self.unexpected_exits():
                raise RuntimeError(f"a worker exited:\n{self.log_tail()}")
            return all(
                " serving queue" in self.log_paths[process.pid].read_text(errors="replace")
                for process in chosen
            )

        wait_for(serving, timeout, what="the workers to serve")

    def unexpected_exits(self) -> list[tuple[int, int]]:
        """(pid, exit code) of workers that exited on their own with an error."""
        return [
            (p.pid, p.returncode)
            for p in self.processes
            if p.returncode not in (None, 0, -signal.SIGKILL, -signal.SIGTERM)
        ]

    def require_running(self) -> None:
        """Raise, with the workers' logs, if every worker has exited: waiting on their
        jobs would only run into a timeout."""
        if self.processes and not self.running():
            raise RuntimeError(f"every worker exited:\n{self.log_tail()}")

    def stop(self) -> list[int | None]:
        """SIGTERM every running worker, wait for them (SIGKILL after the stop
        timeout), and return their exit codes."""
        running = self.running()
        stop_processes(running, self.stop_timeout)
        return [p.returncode for p in running]

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of every worker log, for error messages."""
        parts = []
        for path in sorted(self.log_dir.glob("worker-*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def __enter__(self) -> WorkerFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def warm_up(
    queue: Queue, queue_name: str, workers: int, timeout: float, progress: LiveLine, label: str
) -> int:
    """Run no-op warm-up jobs on ``queue_name`` until each of ``workers`` worker
    processes has claimed one (so each is up, connected and idle). Returns how many
    warm-up jobs it took."""
    deadline = time.monotonic() + timeout
    enqueued: list[int] = []
    # Bounded by time, not rounds: 32 processes take a while to start on a small
    # machine, and the first ones up take every warm-up job until the rest arrive.
    while time.monotonic() < deadline:
        specs = [JobSpec(handlers.NOOP_TASK, {"warmup": True}, queue=queue_name)] * workers
        enqueued += observe.enqueue_in_batches(queue, specs)

        def warmed_up(expected: int = len(enqueued)) -> bool:
            return observe.state_counts(queue, queue_name)["succeeded"] >= expected

        wait_for(warmed_up, max(1.0, deadline - time.monotonic()), what="the warm-up jobs")
        seen = {job.worker_id for job in observe.all_jobs(queue)}
        progress.update(f"{label}: {len(seen)}/{workers} workers ready", force=True)
        if len(seen) >= workers:
            return len(enqueued)
        time.sleep(WARMUP_PAUSE)
    raise TimeoutError(f"only some of the {workers} workers claimed warm-up jobs")
