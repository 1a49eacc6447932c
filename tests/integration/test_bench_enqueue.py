"""The enqueue driver (``pgqueue bench enqueue``) on real PostgreSQL.

A ``--quick`` run of the real command measures every case this machine can run and
verifies each against the rows in its table. wrk and the peers' virtualenvs are used
when they are here (``nox -s enqueue`` installs and builds them); when they are not,
their cases must be skipped with the reason said, never measured some other way.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgqueue_bench.infra import server_cpu
from pgqueue_bench.scenarios.enqueue import driver as enqueue
from pgqueue_bench.scenarios.enqueue import outcome as enqueue_outcome
from pgqueue_bench.scenarios.enqueue import peers as enqueue_peers
from pgqueue_bench.scenarios.enqueue import producers as enqueue_producers

pytestmark = [pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")
ALWAYS_HERE = (
    "raw-insert-1",
    "raw-insert-16",
    "raw-insert-1-pool",
    "raw-insert-16-pool",
    "enqueue-1",
    "enqueue-1-own-connection",
    "enqueue-16",
)
ALWAYS_HERE += ("raw-multirow", "raw-copy", "enqueue-many")
HTTP = ("http-jobs", "http-batch")


def _peer_pythons() -> dict[str, str]:
    """The peers' virtualenvs that ``nox -s peer-<name>`` left in this checkout."""
    found = {}
    for peer in enqueue_peers.PEERS:
        python = REPO / ".nox" / f"peer-{peer}" / "bin" / "python"
        if python.exists():
            found[peer] = str(python)
        else:
            print(f"{peer}: no {python} (python3 -m nox -s peer-{peer} builds it)")
    return found


def test_a_quick_run_measures_every_case_it_can_and_verifies_each(
    server_url: str, tmp_path: Path
) -> None:
    peers = _peer_pythons()
    command = [PGQUEUE, "bench", "enqueue", "--quick", "--connections", "4"]
    # The server's URL: the peers' clients read only URLs. Each case still runs in a
    # schema (the peers: a database) of its own, dropped afterwards.
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    command += [f"--peer={peer}={python}" for peer, python in peers.items()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=REPO)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr

    document = json.loads((tmp_path / "enqueue.json").read_text())
    assert document["benchmark"] == "enqueue"
    assert document["environment"]["machine"]["cpu_count"] >= 1
    assert document["environment"]["postgresql"]["major"] >= 15

    expected = list(ALWAYS_HERE)
    if shutil.which("wrk"):
        expected += HTTP
    else:
        for case in HTTP:
            assert f"skipping {case}: wrk is not installed" in done.stdout
    for peer in enqueue_peers.PEERS:
        cases = (f"{peer}-single", f"{peer}-batch")
        if peer in peers:
            expected += cases
        else:
            for case in cases:
                assert f"skipping {case}: no --peer {peer}=PYTHON given" in done.stdout
    runs = {run["case"]: run for run in document["runs"]}
    assert sorted(runs) == sorted(expected)
    assert sorted(document["summary"]["skipped"]) == sorted(set(enqueue.CASE_NAMES) - set(runs))
    for case, run in runs.items():
        assert run["verified"], (case, run["problems"])
        assert run["jobs"] > 0 and run["jobs_per_second"] > 0, case
        if case in HTTP:
            # Requests in flight when wrk stopped may have committed too.
            assert run["rows_stored"] >= run["warmup_jobs"] + run["jobs"], case
        else:
            assert run["rows_stored"] == run["warmup_jobs"] + run["jobs"], case
    for case in HTTP:
        if case in runs:
            assert 0 < runs[case]["latency_p50_ms"] <= runs[case]["latency_p99_ms"]
    # The cases run in the bench's process measure its CPU, and the server's when the
    # server runs on this machine (a server in a container has no process to read).
    local_server = server_cpu.local_postmaster_pid(server_url) is not None
    for case in ALWAYS_HERE:
        assert runs[case]["client_cpu_us_per_job"] > 0, case
        assert ("server_cpu_us_per_job" in runs[case]) == local_server, case
        if local_server:
            assert runs[case]["server_cpu_us_per_job"] > 0, case
    # The ratios of what ran are computed from the same runs' medians.
    ratios = {(r["numerator"], r["denominator"]): r for r in document["summary"]["ratios"]}
    ratio = ratios[("enqueue-1", "raw-insert-1")]["ratio"]
    assert ratio == pytest.approx(
        runs["enqueue-1"]["jobs_per_second"] / runs["raw-insert-1"]["jobs_per_second"]
    )


def test_rows_that_never_arrived_void_the_run(database_url: str) -> None:
    """A producer whose inserts are rolled back still counts its calls; the row count
    afterwards must say the run is not to be believed."""
    with enqueue_producers.plain_table(database_url) as schema:
        with psycopg.connect(database_url) as conn:  # not autocommit: nothing commits
            timing = enqueue_producers.run_producers(
                [enqueue_producers._raw_insert(conn, schema, 1)], seconds=0.2, warmup=0.0
            )
            conn.rollback()
        stored = enqueue_outcome.count_rows(database_url, sql.Identifier(schema, "plain_jobs"))
        run = enqueue_outcome.outcome(timing, stored)

    assert timing.jobs > 0
    assert stored == 0
    assert not run["verified"]
    assert run["problems"] == [
        f"counted {timing.warmup_jobs + timing.jobs} jobs, the table holds 0"
    ]


def test_the_plain_table_has_the_active_jobs_columns_and_indexes_but_no_triggers(
    database_url: str,
) -> None:
    with (
        enqueue_producers.plain_table(database_url) as schema,
        psycopg.connect(database_url) as conn,
    ):

        def shape(table: str) -> tuple[list, int, int]:
            columns = conn.execute(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                (schema, table),
            ).fetchall()
            indexes = conn.execute(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
                (schema, table),
            ).fetchone()[0]
            triggers = conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal "
                "AND tgrelid = format('%%I.%%I', %s::text, %s::text)::regclass",
                (schema, table),
            ).fetchone()[0]
            return columns, indexes, triggers

        jobs_columns, jobs_indexes, _ = shape("active_jobs")
        plain_columns, plain_indexes, plain_triggers = shape("plain_jobs")

    assert plain_columns == jobs_columns
    assert plain_indexes == jobs_indexes
    assert plain_triggers == 0
