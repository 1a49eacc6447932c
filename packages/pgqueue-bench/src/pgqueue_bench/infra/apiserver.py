"""A real ``pgqueue-api`` process on a loopback port, for the drivers that load the API,
and the minimal FastAPI app (:mod:`pgqueue_bench.scenarios.api.minimal_api`) that ``pgqueue bench
api`` runs beside it, under the same uvicorn worker count.

The process is the one users run (``pgqueue-api --workers N``), started against one
run's schema; requests reach it over TCP like anyone else's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pgqueue_api.settings import ENV_TOKENS
from pgqueue_bench.infra.processes import stop_processes
from pgqueue_bench.infra.servers import LOOPBACK, free_port
from pgqueue_bench.scenarios.api.minimal_api import ENV_DATABASE_URL, ENV_SCHEMA

API = str(Path(sys.executable).parent / "pgqueue-api")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


class ApiProcessError(RuntimeError):
    """``pgqueue-api`` exited or never became healthy; the message carries its output."""


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as answer:
            status: int = answer.status
            return status == 200
    except (urllib.error.URLError, OSError):  # refused while starting, or 503
        return False


@dataclass(frozen=True)
class RunningApi:
    """A ``pgqueue-api`` that answers: its port, and its process (to measure it)."""

    port: int
    pid: int

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


@contextmanager
def api_process(url: str, schema: str, workers: int) -> Iterator[int]:
    """:func:`api_server`, yielding only its port."""
    with api_server(url, schema, workers) as running:
        yield running.port


@contextmanager
def api_server(
    url: str,
    schema: str,
    workers: int,
    *,
    pool_size: int | None = None,
    tokens: Sequence[str] = (),
) -> Iterator[RunningApi]:
    """``pgqueue-api --workers N`` against ``schema`` on a free loopback port; yields it
    once ``/healthz`` answers 200. On the way out the process gets SIGTERM, which
    lets the requests in flight finish, so what it acknowledged is committed by then.
    ``pool_size`` is its ``--pool-size`` (None: the default); with ``tokens``, requests
    need one of them as a bearer token."""
    port = free_port()
    command = [API, "--host", LOOPBACK, "--port", str(port), "--workers", str(workers)]
    if pool_size is not None:
        command += ["--pool-size", str(pool_size)]
    command += ["--no-access-log", "--database-url", url, "--schema", schema]
    command += ["--log-level", "warning"]
    environment = {**os.environ, ENV_TOKENS: ",".join(tokens)}
    with _serving("pgqueue-api", command, environment, port) as running:
        yield running


@contextmanager
def minimal_api_server(url: str, schema: str, workers: int) -> Iterator[RunningApi]:
    """The minimal FastAPI app (:mod:`pgqueue_bench.scenarios.api.minimal_api`) under uvicorn with
    ``workers`` processes, on a free loopback port, its table in ``schema`` (see
    :func:`pgqueue_bench.scenarios.api.minimal_api.create_schema`); yields it once it answers."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "pgqueue_bench.scenarios.api.minimal_api:app"]
    command += ["--host", LOOPBACK, "--port", str(port), "--workers", str(workers)]
    command += ["--no-access-log", "--log-level", "warning"]
    environment = {**os.environ, ENV_DATABASE_URL: url, ENV_SCHEMA: schema}
    with _serving("the minimal API", command, environment, port) as running:
        yield running


@contextmanager
def _serving(
    name: str, command: list[str], environment: dict[str, str], port: int
) -> Iterator[RunningApi]:
    # Its output goes to a file, not a pipe nobody reads while it runs: a full pipe
    # would stall the server.
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=environment
        )

        def said() -> str:
            output.seek(0)
            return output.read().decode(errors="replace")[-3000:]

        base = f"http://{LOOPBACK}:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not _healthy(base):
                if process.poll() is not None:
                    raise ApiProcessError(f"{name} exited {process.returncode}:\n{said()}")
                if time.monotonic() > deadline:
                    raise ApiProcessError(
                        f"{name} was not healthy within {START_TIMEOUT:.0f} s:\n{said()}"
                    )
                time.sleep(0.1)
            yield RunningApi(port=port, pid=process.pid)
        finally:
            stop_processes([process], STOP_TIMEOUT)
