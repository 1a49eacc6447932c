"""Helpers for the worker tests: real ``pgqueue worker`` processes, an in-process worker
on a thread, and the database's view of a worker's connections."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
from polling import wait_for
from processes import environment, start_worker

from pgqueue import Job, JobState, Queue
from pgqueue_worker import Worker

HERE = Path(__file__).resolve().parent
HOOK_LOG_VARIABLE = "PGQUEUE_TEST_HOOK_LOG"
RAISING_HOOKS_VARIABLE = "PGQUEUE_TEST_RAISING_HOOKS"
TEST_PLUGIN = "worker_test_plugin"

# Short leases and intervals, so that expiry, reaping and retries happen within a test.
FAST = (
    "--lease-seconds",
    "1",
    "--heartbeat-seconds",
    "0.25",
    "--reap-interval",
    "0.25",
    "--retry-base",
    "0.05",
    "--retry-cap",
    "0.1",
    "--poll-interval",
    "0.25",
)


class WorkerProcess:
    """A ``pgqueue worker`` subprocess whose output goes to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.process = start_worker(args, env, log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        """Everything the worker printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        """Wait until ``text`` appears in the output (and fail if the worker exits first)."""

        def seen() -> bool:
            if text in self.log():
                return True
            assert self.process.poll() is None, f"worker exited early:\n{self.log()}"
            return False

        wait_for(seen, timeout, what=f"{text!r} in the worker's log")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM once the worker serves, then its exit status.

        Until it logs that it serves, its handlers for SIGTERM may not be installed
        yet and the signal's default action would kill it: a worker started beside
        others can still be importing when they have done all the jobs."""
        self.wait_for_log("serving queue", timeout)
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the worker to exit; its exit status."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout} s:\n{self.log()}") from None

    def ensure_gone(self) -> None:
        """Kill the worker if it is still running (a stopped one is continued first)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
                self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)


def worker_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test environment, plus the test plugin on the path and its hook log."""
    return environment(HERE, **{HOOK_LOG_VARIABLE: str(tmp_path / "hooks.jsonl"), **extra})


def hook_calls(tmp_path: Path) -> list[dict[str, Any]]:
    """Every hook call the test plugin recorded, in order."""
    path = tmp_path / "hooks.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def job_state(queue: Queue, job_id: int) -> JobState:
    return queue.get(job_id).state


def wait_until_state(queue: Queue, job_id: int, *states: JobState, timeout: float = 60) -> Job:
    """Wait until job ``job_id`` is in one of ``states``; return it."""

    def reached() -> Job | None:
        job = queue.get(job_id)
        return job if job.state in states else None

    return wait_for(reached, timeout, what=f"job {job_id} to become {'/'.join(states)}")


def worker_backends(db: psycopg.Connection, application_name: str) -> list[int]:
    """Pids of this database's backends opened by a worker with ``application_name``."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
        (application_name,),
    ).fetchall()
    return [row[0] for row in rows]


def listening_backends(db: psycopg.Connection, schema: str) -> list[int]:
    """Pids of the sessions LISTENing to ``schema``'s channel (the LISTEN is the only
    statement such a session ever runs, so it is the one pg_stat_activity shows)."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'pgqueue-worker-listen'"
        " AND query = %s",
        (f'LISTEN "{schema}_jobs"',),
    ).fetchall()
    return [row[0] for row in rows]


def terminate(db: psycopg.Connection, pids: list[int]) -> None:
    for pid in pids:
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))


class ThreadedWorker:
    """A :class:`Worker` running on a thread of the test process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.clean: bool | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.clean = self.worker.run()
        except BaseException as exc:
            self.error = exc
            raise

    def stop(self, timeout: float = 60.0) -> bool | None:
        """Stop the worker gracefully and wait for it; whether it stopped cleanly."""
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        assert self.error is None, f"the worker raised {self.error!r}"
        return self.clean


class Overlap:
    """Counts handlers running at once, across threads and the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1
