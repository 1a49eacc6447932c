"""The previous release, installed, and the commands the upgrade test runs with it."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from processes import pgqueue_command
from psycopg import sql
from upgrade_release import (
    ReleaseUnavailable,
    check_in_history,
    clean_env,
    installed_release,
    pinned_commit,
)

SNAPSHOT_SCRIPT = Path(__file__).with_name("upgrade_snapshot.py")


@dataclass(frozen=True)
class Release:
    """The previous release: its commit and the virtualenv it is installed in."""

    commit: str
    venv: Path


@pytest.fixture(scope="session")
def previous_release_commit() -> str:
    """The pinned commit of the previous release, checked to be in this clone's history.
    A clone without it fails the tests that need it, saying why: they are never skipped."""
    try:
        commit = pinned_commit()
        check_in_history(commit)
    except ReleaseUnavailable as exc:
        problem = str(exc)
    else:
        return commit
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def previous_release(previous_release_commit: str) -> Release:
    """The previous release installed into a virtualenv of its own (cached per commit)."""
    try:
        venv = installed_release(previous_release_commit)
    except ReleaseUnavailable as exc:
        problem = str(exc)
    else:
        return Release(previous_release_commit, venv)
    pytest.fail(problem, pytrace=False)


@pytest.fixture
def upgrade_schema(database_url: str) -> Iterator[str]:
    """A name for a schema that does not exist yet (the previous release makes it);
    dropped afterwards."""
    name = f"upgrade_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@dataclass
class Pgqueue:
    """One release's ``pgqueue`` command, on one database and schema: every command
    gets ``--database-url`` and ``--schema``; workers log to files in ``logs``."""

    command: list[str]
    env: dict[str, str]
    database_url: str
    schema: str
    logs: Path
    python: Path | None = None

    def _argv(self, *args: str) -> list[str]:
        return [*self.command, *args, "--database-url", self.database_url, "--schema", self.schema]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``pgqueue ARGS`` to its end."""
        return subprocess.run(
            self._argv(*args),
            env=self.env,
            cwd=self.logs,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def json(self, *args: str) -> Any:
        """Run ``pgqueue ARGS``, which must succeed, and return what it printed as JSON."""
        done = self.run(*args)
        assert done.returncode == 0, f"pgqueue {' '.join(args)}: {done.stderr}"
        return json.loads(done.stdout)

    def enqueue(self, task: str, payload: dict[str, Any] | None = None, *flags: str) -> int:
        """Enqueue with ``pgqueue enqueue``; the new job's id."""
        shown = self.json("enqueue", task, "--payload", json.dumps(payload or {}), *flags)
        assert shown["created"], shown
        return int(shown["job"]["id"])

    def start_worker(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start ``pgqueue worker ARGS``, its output in ``logs/NAME.log``, in a session
        of its own (the test decides how it stops)."""
        with (self.logs / f"{name}.log").open("wb") as log:
            return subprocess.Popen(
                self._argv("worker", *args),
                env=self.env,
                cwd=self.logs,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self, name: str) -> str:
        """What worker ``name`` has printed so far."""
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def snapshot(self, ids: list[int]) -> dict[str, dict[str, Any]]:
        """The jobs ``ids`` read by this release's library (see upgrade_snapshot.py)."""
        assert self.python is not None
        done = subprocess.run(
            [str(self.python), "-I", str(SNAPSHOT_SCRIPT), self.database_url, self.schema]
            + [str(job_id) for job_id in ids],
            env=self.env,
            cwd=self.logs,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture
def old_pgqueue(previous_release: Release, database_url: str, upgrade_schema: str, tmp_path):
    """The previous release's ``pgqueue`` on the upgrade test's schema."""
    logs = tmp_path / "old"
    logs.mkdir()
    bin_dir = previous_release.venv / "bin"
    return Pgqueue(
        [str(bin_dir / "pgqueue")],
        clean_env(),
        database_url,
        upgrade_schema,
        logs,
        python=bin_dir / "python",
    )


@pytest.fixture
def new_pgqueue(database_url: str, upgrade_schema: str, tmp_path):
    """This tree's ``pgqueue`` (the test run's own) on the upgrade test's schema."""
    logs = tmp_path / "new"
    logs.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return Pgqueue(pgqueue_command(), env, database_url, upgrade_schema, logs)
