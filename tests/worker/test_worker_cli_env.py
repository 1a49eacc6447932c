"""Every flag of ``pgqueue worker`` can come from its environment variable: one case
per variable, each parsed by the real command (click resolves flag > variable >
default) and built into the worker it would run, whose settings show the effect.
(``test_worker_process`` runs a real worker process configured only by variables.)"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import worker_test_handlers
from processes import pgqueue_command

from pgqueue_worker.cli import worker
from pgqueue_worker.logging_setup import JsonFormatter
from pgqueue_worker.prepare import PreparedWorker, prepare_worker

Check = Callable[[PreparedWorker], Any]


def _root_formatter() -> logging.Formatter | None:
    return logging.getLogger().handlers[0].formatter


CASES: dict[str, tuple[dict[str, str], list[str], Check]] = {
    "PGQUEUE_QUEUE": (
        {"PGQUEUE_QUEUE": "alpha,beta"},
        [],
        lambda p: p.runner.queues == ["alpha", "beta"],
    ),
    "PGQUEUE_CONCURRENCY": ({"PGQUEUE_CONCURRENCY": "3"}, [], lambda p: p.runner.concurrency == 3),
    "flag over PGQUEUE_CONCURRENCY": (
        {"PGQUEUE_CONCURRENCY": "3"},
        ["--concurrency", "5"],
        lambda p: p.runner.concurrency == 5,
    ),
    "PGQUEUE_ASYNC_CONCURRENCY": (
        {"PGQUEUE_ASYNC_CONCURRENCY": "2500"},
        [],
        lambda p: p.runner.async_concurrency == 2500 and p.runner.concurrency == 32,
    ),
    "PGQUEUE_PREFETCH": ({"PGQUEUE_PREFETCH": "7"}, [], lambda p: p.runner.prefetch == 7),
    "PGQUEUE_HANDLERS": (
        {"PGQUEUE_HANDLERS": "worker_test_handlers:SHOUTING"},
        [],
        lambda p: p.runner.handlers["echo"].function is worker_test_handlers.shout,
    ),
    "PGQUEUE_PLUGIN": (
        {"PGQUEUE_PLUGIN": "worker_test_plugin"},
        [],
        lambda p: "whoami" in p.runner.handlers,
    ),
    "PGQUEUE_NO_PLUGIN_AUTOLOAD": (
        {"PGQUEUE_NO_PLUGIN_AUTOLOAD": "1", "PGQUEUE_HANDLERS": "worker_test_handlers:SHOUTING"},
        [],
        lambda p: sorted(p.runner.handlers) == ["echo"],
    ),
    "PGQUEUE_LEASE_SECONDS": (
        {"PGQUEUE_LEASE_SECONDS": "12"},
        [],
        lambda p: p.runner.lease_seconds == 12,
    ),
    "PGQUEUE_HEARTBEAT_SECONDS": (
        {"PGQUEUE_HEARTBEAT_SECONDS": "2"},
        [],
        lambda p: p.runner.heartbeat_seconds == 2,
    ),
    "PGQUEUE_POLL_INTERVAL": (
        {"PGQUEUE_POLL_INTERVAL": "0.5"},
        [],
        lambda p: p.runner.poll_interval == 0.5,
    ),
    "PGQUEUE_NO_LISTEN": ({"PGQUEUE_NO_LISTEN": "1"}, [], lambda p: p.runner.listen is False),
    "PGQUEUE_NO_PREPARE": (
        {"PGQUEUE_NO_PREPARE": "1"},
        [],
        lambda p: p.queue.pool.kwargs["prepare_threshold"] is None,
    ),
    "PGQUEUE_REAP_INTERVAL": (
        {"PGQUEUE_REAP_INTERVAL": "9"},
        [],
        lambda p: p.runner.reap_interval == 9,
    ),
    "PGQUEUE_PRUNE_SUCCEEDED_AFTER": (
        {"PGQUEUE_PRUNE_SUCCEEDED_AFTER": "1h"},
        [],
        lambda p: p.runner.retention.succeeded == 3600,
    ),
    "PGQUEUE_PRUNE_CANCELLED_AFTER": (
        {"PGQUEUE_PRUNE_CANCELLED_AFTER": "2h"},
        [],
        lambda p: p.runner.retention.cancelled == 7200,
    ),
    "PGQUEUE_PRUNE_DEAD_AFTER": (
        {"PGQUEUE_PRUNE_DEAD_AFTER": "3d"},
        [],
        lambda p: p.runner.retention.dead == 3 * 86400,
    ),
    "PGQUEUE_PRUNE_INTERVAL": (
        {"PGQUEUE_PRUNE_INTERVAL": "5m"},
        [],
        lambda p: p.runner.prune_interval == 300,
    ),
    "PGQUEUE_NO_SCHEDULER": (
        {"PGQUEUE_NO_SCHEDULER": "1"},
        [],
        lambda p: p.runner.scheduler is False and p.runner.schedules is not None,
    ),
    "PGQUEUE_CLAIM_MODE": (
        {"PGQUEUE_CLAIM_MODE": "for-update"},
        [],
        lambda p: p.runner.claim_mode == "for-update",
    ),
    "PGQUEUE_RETRY_BASE": ({"PGQUEUE_RETRY_BASE": "2"}, [], lambda p: p.queue.retry_base == 2),
    "PGQUEUE_RETRY_CAP": ({"PGQUEUE_RETRY_CAP": "60"}, [], lambda p: p.queue.retry_cap == 60),
    "PGQUEUE_MAX_RESULT_BYTES": (
        {"PGQUEUE_MAX_RESULT_BYTES": "2048"},
        [],
        lambda p: p.queue.max_result_bytes == 2048,
    ),
    "PGQUEUE_BURST": (
        {"PGQUEUE_BURST": "1"},
        [],
        lambda p: p.runner.burst is True and p.runner.give_up_after == 60,
    ),
    "PGQUEUE_GIVE_UP_AFTER": (
        {"PGQUEUE_GIVE_UP_AFTER": "90s"},
        [],
        lambda p: p.runner.give_up_after == 90,
    ),
    "PGQUEUE_SHUTDOWN_TIMEOUT": (
        {"PGQUEUE_SHUTDOWN_TIMEOUT": "4"},
        [],
        lambda p: p.runner.shutdown_timeout == 4,
    ),
    "PGQUEUE_LOG_FORMAT": (
        {"PGQUEUE_LOG_FORMAT": "json"},
        [],
        lambda p: isinstance(_root_formatter(), JsonFormatter),
    ),
    "PGQUEUE_LOG_LEVEL": (
        {"PGQUEUE_LOG_LEVEL": "debug"},
        [],
        lambda p: logging.getLogger().level == logging.DEBUG,
    ),
    "PGQUEUE_SCHEMA": ({}, [], lambda p: p.queue.schema == p.runner.queue.schema != "pgqueue"),
}


@pytest.fixture
def root_logging() -> Iterator[None]:
    """prepare_worker sets up the process's logging, as the command does: put it back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(("env", "args", "check"), CASES.values(), ids=CASES.keys())
def test_each_flag_of_pgqueue_worker_takes_its_environment_variable(
    env: dict[str, str],
    args: list[str],
    check: Check,
    database_url: str,
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
    root_logging: None,
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", database_url)
    monkeypatch.setenv("PGQUEUE_SCHEMA", schema)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    ctx = worker.make_context("worker", list(args))
    prepared = prepare_worker(**ctx.params)
    try:
        assert check(prepared)
    finally:
        prepared.queue.close()


def test_every_flag_of_pgqueue_worker_shows_its_environment_variable_in_help() -> None:
    without = [param.name for param in worker.params if not param.envvar]
    assert without == []
    shown = subprocess.run(
        [*pgqueue_command(), "worker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    shown = "".join(shown.split())  # click wraps long variable names
    for param in worker.params:
        names = [param.envvar] if isinstance(param.envvar, str) else param.envvar
        for name in names:
            assert name in shown, name
    every_case = {name for env, _, _ in CASES.values() for name in env}
    flags = {param.envvar for param in worker.params if isinstance(param.envvar, str)}
    assert flags - {"PGQUEUE_SCHEMA"} <= every_case
