"""Every command's --help lists its exit statuses, the commands exit with the ones they
list, and both console scripts say their version."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner
from polling import wait_for

from pgqueue.cli import main

BIN = Path(sys.executable).parent
PGQUEUE = str(BIN / "pgqueue")
PGQUEUE_API = str(BIN / "pgqueue-api")
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres"
# pgqueue-bench's drivers (`pgqueue bench ...`) are benchmark tools, not listed here.
NOT_COVERED = {("bench",)}


def command_paths(group: click.Group = main, prefix: tuple[str, ...] = ()):
    """Every command under ``pgqueue``, as the words that run it, the root included."""
    yield prefix
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        path = (*prefix, name)
        if path in NOT_COVERED:
            continue
        command = group.get_command(ctx, name)
        assert command is not None, f"pgqueue {name} does not load"
        if isinstance(command, click.Group):
            yield from command_paths(command, path)
        else:
            yield path


def listed_statuses(help_text: str) -> set[str]:
    """The statuses in the ``Exit status:`` block of a --help text."""
    assert "Exit status:" in help_text, help_text
    block = help_text.split("Exit status:", 1)[1]
    return {line.split()[0] for line in block.splitlines() if line[:6].strip()[:1].isdigit()}


def help_of(*words: str) -> str:
    result = CliRunner().invoke(main, [*words, "--help"], prog_name="pgqueue")
    assert result.exit_code == 0, result.output
    return result.output


ALL_COMMANDS = list(command_paths())
SPECIAL = {
    ("worker",): {"0", "1", "2", "3", "4", "130"},
    ("api",): {"0", "1", "2", "3", "130"},
    ("dev",): {"0", "1", "2", "1+"},
    ("db", "status"): {"0", "1", "2", "3"},
    # With --wait: 4, the job ended dead or cancelled; 5, it was not final in time.
    ("enqueue",): {"0", "1", "2", "4", "5"},
    ("job",): {"0", "1", "2", "4", "5"},
}


def test_the_commands_checked_include_the_ones_users_run():
    assert {(), ("worker",), ("api",), ("dev",), ("db",), ("db", "status")} <= set(ALL_COMMANDS)
    assert {("db", "start"), ("db", "stop"), ("db", "url"), ("migrate",)} <= set(ALL_COMMANDS)


@pytest.mark.parametrize("words", ALL_COMMANDS, ids=lambda w: " ".join(("pgqueue", *w)))
def test_every_commands_help_lists_its_exit_statuses(words):
    statuses = listed_statuses(help_of(*words))
    assert statuses == SPECIAL.get(words, {"0", "1", "2"})


def test_the_pgqueue_api_script_lists_them_too():
    shown = subprocess.run([PGQUEUE_API, "--help"], capture_output=True, text=True, check=True)
    assert listed_statuses(shown.stdout) == {"0", "1", "2", "3", "130"}
    assert "130  stopped cleanly by SIGINT, 143 by SIGTERM" in shown.stdout


@pytest.mark.parametrize(
    ("script", "distribution"), [(PGQUEUE, "pgqueue-core"), (PGQUEUE_API, "pgqueue-api")]
)
def test_the_console_scripts_say_their_version(script, distribution):
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    name = Path(script).name
    assert result.stdout == f"{name}, version {metadata.version(distribution)}\n"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_API_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        pytest.param((PGQUEUE, "no-such-command"), 2, id="unknown command"),
        pytest.param((PGQUEUE, "job"), 2, id="missing argument"),
        pytest.param((PGQUEUE, "job", "1", "--database-url", UNREACHABLE), 1, id="job, no db"),
        pytest.param((PGQUEUE, "migrate", "--database-url", UNREACHABLE), 1, id="migrate, no db"),
        pytest.param((PGQUEUE_API, "--port", "0"), 2, id="pgqueue-api bad port"),
        pytest.param((PGQUEUE_API, "--database-url", UNREACHABLE), 1, id="pgqueue-api, no db"),
    ],
)
def test_mistakes_exit_with_the_status_listed_for_them(argv, status):
    result = run(*argv)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "status"),
    [
        pytest.param("1", -signal.SIGTERM, id="one process: ends by the signal (143)"),
        pytest.param("2", 0, id="--workers 2: the supervisor exits 0"),
    ],
)
def test_pgqueue_api_stops_on_sigterm_with_the_status_listed(database_url, schema, workers, status):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_API_")}
    argv = ["--port", str(port), "--workers", workers, "--database-url", database_url]
    process = subprocess.Popen(
        [PGQUEUE_API, *argv, "--schema", schema],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                process.poll() is not None
                or httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            ),
            what="the API to answer",
            interval=0.2,
            ignoring=(httpx.HTTPError,),
        )
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Popen reports an end by a signal as minus its number; a shell shows 128 + it.
    assert process.returncode == status, stderr
    assert "Application shutdown complete" in stderr
