"""``pgqueue dev``: the embedded PostgreSQL, the API and a worker, in one terminal.

The API and the worker run as child processes (``pgqueue api`` and ``pgqueue worker``,
from pgqueue-api and pgqueue-worker), so the core never imports them. Their output is
streamed line by line with a prefix; Ctrl-C stops both cleanly and leaves the embedded
server running for the next time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import IO

import click

from pgqueue import embedded, migrations
from pgqueue.settings import DEFAULT_SCHEMA

STOP_TIMEOUT_SECONDS = 30.0
# The subcommands `pgqueue dev` runs, and the distributions that add them to `pgqueue`.
NEEDED_COMMANDS = {"api": "pgqueue-api", "worker": "pgqueue-worker"}


@dataclass
class Child:
    """A supervised child process and the prefix its output is shown with."""

    name: str
    process: subprocess.Popen[str]


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (checked by binding it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _pgqueue_command(*args: str) -> list[str]:
    """``pgqueue ARGS`` run by this same interpreter, whatever PATH says."""
    return [sys.executable, "-c", "from pgqueue.cli import main; main()", *args]


def _stream(child: Child, stream: IO[str], width: int) -> None:
    prefix = click.style(f"{child.name:<{width}} | ", fg="cyan" if child.name == "api" else "green")
    for line in stream:
        click.echo(prefix + line.rstrip("\n"))


def _start(name: str, command: Sequence[str], env: dict[str, str], width: int) -> Child:
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=env,
        # Own process group: Ctrl-C reaches the supervisor only, which then stops the
        # children in order instead of all of them at once.
        start_new_session=True,
    )
    child = Child(name, process)
    assert process.stdout is not None
    threading.Thread(target=_stream, args=(child, process.stdout, width), daemon=True).start()
    return child


def _stop(children: Sequence[Child]) -> int:
    """SIGTERM every child, wait for them, and return the worst exit code."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    worst = 0
    for child in children:
        try:
            code = child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            code = child.process.wait()
        worst = max(worst, abs(code))
    return worst


def check_commands_installed() -> None:
    """Fail with one line, before starting anything, if a distribution whose command
    ``pgqueue dev`` runs is not installed (its child would only say ``No such command``)."""
    installed = {ep.name for ep in metadata.entry_points(group="pgqueue.commands")}
    missing = [dist for command, dist in NEEDED_COMMANDS.items() if command not in installed]
    if missing:
        which = " and ".join(missing)
        raise click.ClickException(
            f"pgqueue dev needs {which}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: pip install {' '.join(missing)}"
        )


def run_dev(host: str, port: int, schema: str, concurrency: int) -> int:
    """Start everything, stream logs until Ctrl-C or a child exits, stop everything."""
    check_commands_installed()
    if not port_is_free(host, port):
        raise click.ClickException(f"port {port} on {host} is taken: pass --port to use another")
    pgdata = embedded.locate()
    click.echo(f"starting the embedded PostgreSQL in {pgdata.path} ({pgdata.reason}) ...")
    url = embedded.start(pgdata.path)
    migrations.migrate(url, schema)
    env = {**os.environ, "DATABASE_URL": url, "PGQUEUE_SCHEMA": schema}
    base = f"http://{host}:{port}"
    width = len("worker")
    children = [
        _start("api", _pgqueue_command("api", "--host", host, "--port", str(port)), env, width),
        _start("worker", _pgqueue_command("worker", "--concurrency", str(concurrency)), env, width),
    ]
    click.echo(
        f"\npgqueue is starting:\n"
        f"  API        {base}   (docs: {base}/docs, metrics: {base}/metrics)\n"
        f"  database   {url}   (schema {schema})\n\n"
        f"enqueue a job and read it back:\n"
        f"  curl -s -X POST {base}/jobs -H 'content-type: application/json' \\\n"
        f'       -d \'{{"task": "echo", "payload": {{"hello": "world"}}}}\'\n'
        f'  curl -s {base}/jobs/ID      # ID: the "id" in the first answer\n\n'
        f"Ctrl-C stops the API and the worker; `pgqueue db stop` stops PostgreSQL.\n"
    )
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    signal.signal(signal.SIGTERM, lambda *_: interrupted.set())
    try:
        while not interrupted.is_set():
            exited = [c for c in children if c.process.poll() is not None]
            if exited:
                click.echo(f"{exited[0].name} exited with code {exited[0].process.returncode}")
                break
            interrupted.wait(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
        code = _stop(children)
    click.echo("stopped; the embedded PostgreSQL is still running (`pgqueue db stop`)")
    return 0 if interrupted.is_set() else max(code, 1)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the API binds.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port of the API.")
@click.option("--schema", default=DEFAULT_SCHEMA, show_default=True, envvar="PGQUEUE_SCHEMA")
@click.option("--concurrency", type=click.IntRange(1, 1000), default=4, show_default=True)
def dev(host: str, port: int, schema: str, concurrency: int) -> None:
    """Run the embedded PostgreSQL, the API and a worker with every installed plugin."""
    sys.exit(run_dev(host, port, schema, concurrency))
