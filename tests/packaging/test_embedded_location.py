"""Where the embedded PostgreSQL keeps its data: one place per project, whichever of its
directories a command starts in, so that `pgqueue db`, `pgqueue dev`, workers and the
pytest plugin share one server.

Starting a server is slow, so the rule is tested on folders that only look like
projects, and the commands on folders where nothing runs; the last test checks the
suite's own running server against `pgqueue db url` run from a package's folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging_support import ROOT

from pgqueue import embedded
from pgqueue.embedded import Location, locate

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("PGQUEUE_PGDATA", raising=False)


def make(base: Path, *paths: str) -> None:
    """Folders (ending in /) and empty files under ``base``."""
    for path in paths:
        target = base / path
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()


@pytest.fixture
def monorepo(tmp_path: Path) -> Path:
    """A repository like this one: a root with .git and pyproject.toml, and packages
    with pyproject.toml files of their own."""
    repo = tmp_path / "repo"
    make(
        repo,
        ".git/",
        "pyproject.toml",
        "packages/core/pyproject.toml",
        "packages/core/src/core/",
        "tests/unit/",
    )
    return repo


def test_every_folder_of_a_monorepo_finds_the_root_pgdata(monorepo):
    expected = Location(monorepo / ".pgdata", "project root")
    for where in ("", "packages", "packages/core", "packages/core/src/core", "tests/unit"):
        assert locate(monorepo / where) == expected, where


def test_an_existing_pgdata_is_found_from_below_it(monorepo):
    (monorepo / ".pgdata").mkdir()
    assert locate(monorepo / "packages/core/src") == Location(
        monorepo / ".pgdata", "existing .pgdata"
    )


def test_the_nearest_existing_pgdata_inside_the_project_wins(monorepo):
    make(monorepo, ".pgdata/", "packages/core/.pgdata/")
    assert locate(monorepo / "packages/core/src").path == monorepo / "packages/core/.pgdata"
    assert locate(monorepo / "tests").path == monorepo / ".pgdata"


def test_a_pgdata_above_the_project_is_not_this_projects(tmp_path, monorepo):
    (tmp_path / ".pgdata").mkdir()
    assert locate(monorepo / "packages") == Location(monorepo / ".pgdata", "project root")


def test_a_git_worktree_file_marks_the_root_too(tmp_path):
    make(tmp_path, "work/.git", "work/lib/pyproject.toml", "work/lib/src/")
    assert locate(tmp_path / "work/lib/src").path == tmp_path / "work/.pgdata"


def in_a_project(folder: Path) -> bool:
    return any(
        (d / m).exists() for d in [folder, *folder.parents] for m in embedded.PROJECT_MARKERS
    )


@pytest.fixture
def outside_projects(tmp_path: Path) -> Iterator[Path]:
    """An empty folder that no project holds. The test run's temporary folder may be
    inside one (`nox -s tests` keeps it under .nox/ in the repository)."""
    if not in_a_project(tmp_path):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-location-", dir="/tmp"))
    try:
        if in_a_project(folder):
            pytest.skip("no temporary folder outside a project")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_without_git_the_nearest_pyproject_is_the_root(outside_projects):
    make(outside_projects, "proj/pyproject.toml", "proj/src/app/")
    assert locate(outside_projects / "proj/src/app") == Location(
        outside_projects / "proj/.pgdata", "project root"
    )


def test_outside_any_project_it_is_the_current_directory(outside_projects):
    make(outside_projects, "loose/")
    assert locate(outside_projects / "loose") == Location(
        outside_projects / "loose/.pgdata", "current directory"
    )


def test_pgqueue_pgdata_overrides_the_search(tmp_path, monorepo, monkeypatch):
    monkeypatch.setenv("PGQUEUE_PGDATA", str(tmp_path / "elsewhere"))
    assert locate(monorepo / "packages") == Location(tmp_path / "elsewhere", "PGQUEUE_PGDATA")


def test_the_default_start_is_the_current_directory(monorepo, monkeypatch):
    monkeypatch.chdir(monorepo / "packages/core/src")
    assert locate() == Location(monorepo / ".pgdata", "project root")
    assert embedded.pgdata_path() == monorepo / ".pgdata"


def run_pgqueue(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PGQUEUE_PGDATA", "DATABASE_URL"}}
    return subprocess.run(
        [*PGQUEUE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_db_status_says_where_and_that_nothing_runs(monorepo):
    result = run_pgqueue("db", "status", cwd=monorepo / "packages/core/src")
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == [
        f"data directory: {monorepo / '.pgdata'} (project root)",
        "not running: no cluster there yet (`pgqueue db start` creates one)",
    ]


def test_db_status_tells_a_stopped_cluster_from_none(monorepo):
    (monorepo / ".pgdata").mkdir()
    (monorepo / ".pgdata/PG_VERSION").write_text("18\n")
    result = run_pgqueue("db", "status", cwd=monorepo / "tests")
    assert result.returncode == 3
    assert result.stdout.splitlines() == [
        f"data directory: {monorepo / '.pgdata'} (existing .pgdata)",
        "not running: a PostgreSQL 18 cluster (`pgqueue db start` starts it)",
    ]


def test_db_url_and_the_other_commands_look_in_the_same_place(monorepo):
    url = run_pgqueue("db", "url", cwd=monorepo / "packages")
    assert url.returncode == 1
    assert url.stderr.strip() == (
        f"Error: the embedded PostgreSQL in {monorepo / '.pgdata'} is not running: "
        "run `pgqueue db start`"
    )
    status = run_pgqueue("status", cwd=monorepo / "packages")
    assert status.returncode == 2
    assert "pgqueue db start" in status.stderr
    assert "Traceback" not in url.stderr + status.stderr


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL") or os.environ.get("PGQUEUE_PGDATA")),
    reason="the suite's server is not found by the search",
)
def test_the_suites_embedded_server_is_the_one_db_url_finds_from_a_package(server_url):
    # The pytest plugin started (or found) the server from where pytest runs; the CLI,
    # run in a package's folder, finds the same one.
    if Path.cwd().resolve() != ROOT and ROOT not in Path.cwd().resolve().parents:
        pytest.skip("pytest runs outside the repository")
    result = run_pgqueue("db", "url", cwd=ROOT / "packages/pgqueue-core/src")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == server_url
