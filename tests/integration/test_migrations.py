"""Migrations: applied once, recorded, and safe when many processes race."""

import multiprocessing
import uuid

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
