"""pgqueue installed as a user installs it: wheels built from this repository, installed
into a fresh virtualenv with nothing editable (pgqueue's own distributions only from the
build folder, third-party ones from the package index), then a job run end to end with
that virtualenv's commands against the test database.

Select it with ``-m packaging``; it needs the package index for the third-party
distributions (uv's cache serves repeated runs) and takes about a minute.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from packaging_support import build_all, distributions, uv
from psycopg import sql

pytestmark = [pytest.mark.packaging, pytest.mark.slow]

VERSION = distributions()[0].version
OURS = {dist.name for dist in distributions()}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: none of the test run's virtualenv, Python path
    or database settings."""
    dropped = {"VIRTUAL_ENV", "PYTHONPATH", "DATABASE_URL"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PGQUEUE")}
    return {**env, **extra}


@contextmanager
def once_per_run(tmp_path_factory, name: str) -> Iterator[tuple[Path, bool]]:
    """A folder shared by every test process of this run (pytest-xdist's workers
    included), and whether it is already made; callers make it under an exclusive lock."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    folder = shared / name
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder, (folder / ".done").exists()
        (folder / ".done").touch()


def make_venv(folder: Path, dist_dir: Path, *requirements: str) -> Path:
    """A fresh virtualenv with ``requirements``, pgqueue's from ``dist_dir`` only."""
    subprocess.run(
        [uv(), "venv", "--quiet", "--python", sys.executable, str(folder)],
        check=True,
        env=clean_env(),
        timeout=120,
    )
    python = ["--python", str(folder / "bin" / "python")]
    links = ["--find-links", str(dist_dir)]
    subprocess.run(
        [uv(), "pip", "install", "--quiet", *python, *links, *requirements],
        check=True,
        env=clean_env(),
        timeout=300,
    )
    return folder


@pytest.fixture(scope="session")
def dist_dir(tmp_path_factory) -> Path:
    """Every distribution's sdist and wheel, built once per run."""
    with once_per_run(tmp_path_factory, "dist") as (folder, done):
        if not done:
            folder.mkdir(exist_ok=True)
            assert len(build_all(folder)) == len(OURS)
    return folder


@pytest.fixture(scope="session")
def venv(dist_dir: Path, tmp_path_factory) -> Path:
    """A fresh virtualenv with pgqueue-worker and pgqueue-examples from ``dist_dir``."""
    with once_per_run(tmp_path_factory, "venv") as (folder, done):
        if not done:
            make_venv(
                folder, dist_dir, f"pgqueue-worker=={VERSION}", f"pgqueue-examples=={VERSION}"
            )
    return folder


def in_venv(venv: Path, *argv: str, env: dict[str, str] | None = None):
    """Run one of the virtualenv's commands from a folder outside the repository."""
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        cwd=venv.parent,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_pgqueues_distributions_come_from_the_built_wheels_none_editable(venv, dist_dir):
    script = (
        "import json, pgqueue\n"
        "from importlib import metadata\n"
        "found = {}\n"
        "for d in metadata.distributions():\n"
        "    url = d.read_text('direct_url.json')\n"
        "    found[d.metadata['Name']] = [d.version, url]\n"
        "print(json.dumps({'pgqueue': pgqueue.__file__, 'dists': found}))\n"
    )
    result = in_venv(venv, "python", "-c", script)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert Path(shown["pgqueue"]).is_relative_to(venv)
    installed = {name: value for name, value in shown["dists"].items() if name in OURS}
    # The worker and the examples asked for, pgqueue-core for them; nothing else of ours.
    assert set(installed) == {"pgqueue-core", "pgqueue-worker", "pgqueue-examples"}
    for name, (version, direct_url) in installed.items():
        assert version == VERSION, name
        # Installed from a find-links folder like from an index, not from a source tree.
        assert direct_url is None or '"editable": true' not in direct_url, name
    built = {p.name.split("-")[0].replace("_", "-") for p in dist_dir.glob("*.whl")}
    assert set(installed) <= built


def test_the_version_is_the_built_one(venv):
    result = in_venv(venv, "pgqueue", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"pgqueue, version {VERSION}\n"


@pytest.fixture
def fresh_schema(database_url: str) -> Iterator[str]:
    """A name for a schema that does not exist yet; dropped afterwards."""
    name = f"dist_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_a_job_runs_end_to_end_with_the_installed_commands(venv, database_url, fresh_schema):
    db = ["--database-url", database_url, "--schema", fresh_schema]

    migrated = in_venv(venv, "pgqueue", "migrate", *db)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("applied migrations ")

    plugins = in_venv(venv, "pgqueue", "plugins", "--json")
    assert plugins.returncode == 0, plugins.stderr
    assert "echo" in {task for p in json.loads(plugins.stdout) for task in p.get("tasks", [])}

    payload = {"hello": "world", "n": [1, 2, 3]}
    enqueued = in_venv(venv, "pgqueue", "enqueue", "echo", "--payload", json.dumps(payload), *db)
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = json.loads(enqueued.stdout)["job"]["id"]

    worker = in_venv(venv, "pgqueue", "worker", "--burst", *db)
    assert worker.returncode == 0, worker.stderr + worker.stdout

    shown = in_venv(venv, "pgqueue", "job", str(job_id), *db)
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert (job["state"], job["result"], job["attempts"]) == ("succeeded", payload, 1)


def test_the_unrelated_pgqueue_project_is_named_not_imported(venv, dist_dir, tmp_path):
    # The 2016 PyPI project `pgqueue`: a single module pgqueue.py that needs psycopg2.
    # Installed into a folder of its own that comes first on PYTHONPATH, it would win
    # the name over the virtualenv's pgqueue-core.
    folder = tmp_path / "elsewhere"
    subprocess.run(
        [uv(), "pip", "install", "--quiet", "--no-deps", "--target", str(folder), "pgqueue==0.6"],
        check=True,
        env=clean_env(),
        timeout=300,
    )
    assert (folder / "pgqueue.py").is_file()
    env = clean_env(PYTHONPATH=str(folder))
    expected = (
        f"`import pgqueue` finds {folder / 'pgqueue.py'}, from pgqueue 0.6, a project "
        f"unrelated to pgqueue-core that shares the name: pip uninstall pgqueue, or take "
        f"{folder} off the path"
    )

    version = in_venv(venv, "pgqueue", "--version", env=env)
    assert (version.returncode, version.stderr) == (1, f"Error: {expected}\n")

    imported = in_venv(venv, "python", "-c", "import pgqueue", env=env)
    assert imported.returncode == 1
    assert imported.stderr.splitlines()[-1] == f"pgqueue_launcher.ForeignPgqueue: {expected}"
    # Not an obscure failure from inside the other module.
    assert "psycopg2" not in imported.stderr

    # Installed into the same site-packages, pgqueue-core's package wins the name
    # (a package comes before a module of the same name in one folder): nothing to say.
    beside = make_venv(tmp_path / "beside", dist_dir, f"pgqueue-core=={VERSION}")
    python = ["--python", str(beside / "bin" / "python")]
    subprocess.run(
        [uv(), "pip", "install", "--quiet", "--no-deps", *python, "pgqueue==0.6"],
        check=True,
        env=clean_env(),
        timeout=300,
    )
    assert len(list(beside.glob("lib/python*/site-packages/pgqueue.py"))) == 1
    shown = in_venv(beside, "pgqueue", "--version")
    assert (shown.returncode, shown.stdout) == (0, f"pgqueue, version {VERSION}\n")
