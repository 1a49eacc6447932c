"""Mistakes a user makes on the command line get one line naming the problem and the
fix, and a non-zero exit: never a traceback. Real ``pgqueue`` processes, real
PostgreSQL, and real plugins installed as distributions (a ``.dist-info`` directory on
the path, found through ``importlib.metadata`` like any installed package)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import psycopg
import pytest
from processes import pgqueue_command
from psycopg import sql

from pgqueue import migrate

pytestmark = pytest.mark.slow

BROKEN_PLUGIN = '''"""A plugin whose import fails."""

import pgqueue

import a_module_that_is_not_installed  # noqa: F401
'''

MISSPELLED_PLUGIN = '''"""A plugin with a misspelled hook name."""

import pgqueue


@pgqueue.hookimpl
def on_fial(job):
    pass
'''


def install_plugin(site: Path, name: str, source: str) -> None:
    """Install module ``name`` as distribution ``name`` with an entry point ``name`` in
    the ``pgqueue`` group, into the directory ``site`` (to be put on PYTHONPATH)."""
    site.mkdir(exist_ok=True)
    (site / f"{name}.py").write_text(source)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[pgqueue]\n{name} = {name}\n")


def run(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*pgqueue_command(), *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one ``Error:`` line of a failed command (click may precede a usage mistake
    with a usage hint), after checking there is no traceback."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def with_path(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


COMMANDS_ON_A_SCHEMA = [
    ["status"],
    ["status", "--json"],
    ["enqueue", "echo", "--payload", "{}"],
    ["job", "1"],
    ["cancel", "1"],
    ["retry", "1"],
    ["prune", "--older-than", "1d"],
    ["worker", "--burst"],
]


@pytest.mark.parametrize("command", COMMANDS_ON_A_SCHEMA, ids=" ".join)
def test_every_command_on_a_schema_never_migrated_says_run_pgqueue_migrate(
    command: list[str], database_url: str
) -> None:
    schema = f"never_{uuid.uuid4().hex[:8]}"
    result = run(*command, "--database-url", database_url, "--schema", schema)

    line = one_error_line(result)
    assert result.returncode == 1
    assert (
        line == f"Error: schema {schema} is not migrated: run `pgqueue migrate --schema {schema}`"
    )


def test_a_schema_made_by_another_pgqueue_names_the_migrations_it_does_not_know(
    database_url: str, schema: str, db
) -> None:
    # What a schema made by a newer pgqueue (or a pre-release one) records.
    db.execute(
        sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (99, 'from_the_future')").format(
            sql.Identifier(schema)
        )
    )

    result = run("status", "--database-url", database_url, "--schema", schema)

    line = one_error_line(result)
    assert line.startswith(
        f"Error: schema {schema!r} records migrations this version of pgqueue does not know "
        "(99 from_the_future)"
    ), line
    # The way out during a rolling upgrade is the newer pgqueue, never dropping the jobs.
    assert line.endswith("install that version (or a later one) here"), line
    assert "DROP" not in line


@pytest.mark.parametrize("command", [["status"], ["worker", "--burst"]], ids=" ".join)
def test_a_schema_behind_by_a_migration_names_it(
    command: list[str], database_url: str, schema: str, db
) -> None:
    # What a schema migrated by an older pgqueue records: everything but the latest.
    [(latest,)] = db.execute(
        sql.SQL(
            "DELETE FROM {0}.migrations"
            " WHERE version = (SELECT max(version) FROM {0}.migrations) RETURNING version"
        ).format(sql.Identifier(schema))
    ).fetchall()

    result = run(*command, "--database-url", database_url, "--schema", schema)

    assert result.returncode == 1
    assert one_error_line(result) == (
        f"Error: schema {schema} lacks migrations {latest}: run `pgqueue migrate --schema {schema}`"
    )


def test_a_jobs_table_dropped_behind_the_check_is_still_one_line(
    database_url: str, schema: str, db
) -> None:
    db.execute(sql.SQL("DROP TABLE {}.active_jobs CASCADE").format(sql.Identifier(schema)))

    result = run("enqueue", "echo", "--database-url", database_url, "--schema", schema)

    line = one_error_line(result)
    assert line.startswith(f"Error: schema {schema} is not migrated: run `pgqueue migrate")
    assert f'relation "{schema}.active_jobs" does not exist' in line


def test_plugins_lists_the_others_and_reports_a_plugin_whose_import_fails(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_plugin(site, "pgq_broken_plugin", BROKEN_PLUGIN)

    result = run("plugins", env=with_path(site))

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert "examples 0.1.0" in out and "tasks: echo, fail, flaky, sleep" in out
    assert "pgq_broken_plugin 1.0 (failed to load)" in out
    assert "entry point: pgq_broken_plugin = pgq_broken_plugin" in out
    assert (
        "error: ModuleNotFoundError: No module named 'a_module_that_is_not_installed' "
        f"({site / 'pgq_broken_plugin.py'}, line 5)"
    ) in out
    assert one_error_line(result) == "Error: 1 plugin(s) failed to load: pgq_broken_plugin"


def test_plugins_reports_an_installed_plugin_with_a_misspelled_hook(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_plugin(site, "pgq_misspelled_plugin", MISSPELLED_PLUGIN)

    result = run("plugins", "--json", env=with_path(site))

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert '"name": "examples"' in result.stdout
    assert "pgq_misspelled_plugin: unknown hook 'on_fial'" in result.stdout


def test_worker_refuses_to_start_naming_a_plugin_that_fails_to_load(
    tmp_path: Path, database_url: str, schema: str
) -> None:
    site = tmp_path / "site"
    install_plugin(site, "pgq_broken_plugin", BROKEN_PLUGIN)

    result = run(
        "worker", "--burst", "--database-url", database_url, "--schema", schema, env=with_path(site)
    )

    line = one_error_line(result)
    assert result.returncode == 1
    assert line.startswith(
        "Error: not starting: plugin 'pgq_broken_plugin' (entry point "
        "pgq_broken_plugin = pgq_broken_plugin of pgq_broken_plugin 1.0) failed to load: "
        "ModuleNotFoundError: No module named 'a_module_that_is_not_installed'"
    )


def test_a_plugin_module_with_a_misspelled_hook_is_one_line(
    tmp_path: Path, database_url: str, schema: str
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "misspelled_hooks.py").write_text(MISSPELLED_PLUGIN)

    result = run(
        "worker",
        "--burst",
        "--plugin",
        "misspelled_hooks",
        "--database-url",
        database_url,
        "--schema",
        schema,
        env=with_path(site),
    )

    line = one_error_line(result)
    assert result.returncode == 2
    assert "--plugin" in line
    assert "misspelled_hooks: unknown hook 'on_fial'; pgqueue's hooks are " in line
    assert "on_fail" in line


def test_an_unreachable_database_keeps_host_port_and_cause() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens on it
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    for command in (["status"], ["migrate"], ["enqueue", "echo"]):
        line = one_error_line(run(*command, "--database-url", url))
        assert line.startswith("Error: cannot connect to the database: ")
        assert f'"127.0.0.1", port {port} failed: Connection refused' in line
        assert "Is the server running on that host" in line


@pytest.fixture(scope="module")
def python_without_pgqueue_api(tmp_path_factory) -> Path:
    """A real virtual environment with everything the tests' own has, except the
    pgqueue-api distribution."""
    root = tmp_path_factory.mktemp("venv")
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    target = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    for entry in ours.iterdir():
        if "pgqueue_api" in entry.name:
            continue
        link = target / entry.name
        if not link.exists():
            link.symlink_to(entry)
    return root / "bin" / "python"


def test_dev_without_pgqueue_api_says_to_install_it(python_without_pgqueue_api: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(python_without_pgqueue_api), "-c", "from pgqueue.cli import main; main()"]

    result = subprocess.run(
        [*command, "dev", "--port", str(port)], capture_output=True, text=True, timeout=120
    )

    line = one_error_line(result)
    assert result.returncode == 1
    assert (
        line
        == "Error: pgqueue dev needs pgqueue-api, which is not installed: pip install pgqueue-api"
    )
    assert "No such command" not in result.stdout + result.stderr


def test_migrated_schema_is_still_served(database_url: str) -> None:
    # The check that refuses an unmigrated schema lets a migrated one through.
    schema = f"fresh_{uuid.uuid4().hex[:8]}"
    migrate(database_url, schema)
    try:
        result = run("status", "--database-url", database_url, "--schema", schema)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"no jobs in schema {schema}"
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
