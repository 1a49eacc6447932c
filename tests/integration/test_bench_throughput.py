"""The throughput driver (``pgqueue bench throughput``) on real PostgreSQL: real
``pgqueue worker`` processes, the original design's naive loop and the batched ceiling
drain the same jobs, each run verified and measured with its CPU per job (and, where the
server loads pg_stat_statements, its statements)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgqueue_bench.infra.binaries import binaries_for

pytestmark = [pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


def test_one_job_per_claim_and_the_naive_loop_drain_the_same_jobs(
    server_url: str, tmp_path: Path
) -> None:
    command = [PGQUEUE, "bench", "throughput", "--jobs", "300", "--repeats", "1"]
    command += ["--mode", "skip-locked", "--mode", "naive-loop", "--workers", "2"]
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=REPO)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr

    document = json.loads((tmp_path / "throughput.json").read_text())
    runs = {run["mode"]: run for run in document["runs"]}
    assert sorted(runs) == ["naive-loop", "skip-locked"]
    for mode, run in runs.items():
        # Every job succeeded at its first attempt, started and finished in the window.
        assert run["verified"] and run["jobs"] == 300, (mode, run)
        assert run["jobs_per_second"] > 0 and run["seconds"] > 0, mode
        # The server runs on this machine: both sides' CPU is measured.
        assert run["client_cpu_us_per_job"] > 0 and run["server_cpu_us_per_job"] > 0, mode
    assert "naive-loop" in document["parameters"]["modes"]
    assert document["summary"]["naive-loop"]["2"]["jobs_per_second"]["runs"] == 1
    # The loop's schema is dropped with its run.
    with psycopg.connect(server_url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench\\_naive\\_%'"
        ).fetchone()
    assert left == (0,)


def test_the_default_drain_is_measured_against_the_batched_ceiling_round_by_round(
    server_url: str, tmp_path: Path
) -> None:
    command = [PGQUEUE, "bench", "throughput", "--jobs", "400", "--repeats", "2"]
    command += ["--mode", "default", "--mode", "batched-ceiling", "--workers", "2"]
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=REPO)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr

    document = json.loads((tmp_path / "throughput.json").read_text())
    runs = document["runs"]
    assert [(run["repeat"], run["mode"]) for run in runs] == [
        (1, "default"),
        (1, "batched-ceiling"),
        (2, "default"),
        (2, "batched-ceiling"),
    ]
    for run in runs:
        assert run["verified"] and run["jobs"] == 400, run
        assert run["client_cpu_us_per_job"] > 0 and run["server_cpu_us_per_job"] > 0, run
    ceiling = runs[1]
    assert ceiling["worker_arguments"] == [
        "python",
        "-m",
        "pgqueue_bench.scenarios.throughput.batched_ceiling",
    ]
    assert "100 jobs per claim" in document["parameters"]["modes"]["batched-ceiling"]
    # One ratio per round, each of that round's two runs.
    ratio = document["summary"]["default"]["2"]["ratio_to_batched-ceiling"]
    assert ratio["runs"] == 2
    expected = sorted(
        runs[index]["jobs_per_second"] / runs[index + 1]["jobs_per_second"] for index in (0, 2)
    )
    assert [ratio["min"], ratio["max"]] == pytest.approx(expected)
    assert "x batched-ceiling (median of rounds)" in done.stdout
    with psycopg.connect(server_url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench\\_naive\\_%'"
        ).fetchone()
    assert left == (0,)


def _ships_pg_stat_statements(server_url: str) -> bool:
    """Whether the PostgreSQL of the server's major version that a private cluster runs
    (the system PostgreSQL 15, or the embedded 18) comes with pg_stat_statements."""
    binaries = binaries_for(server_url)
    return any(binaries.bin_dir.parent.rglob("pg_stat_statements.so"))


def test_statements_of_each_run_come_from_pg_stat_statements_on_a_private_cluster(
    server_url: str, tmp_path: Path
) -> None:
    command = [PGQUEUE, "bench", "throughput", "--jobs", "300", "--repeats", "1"]
    command += ["--mode", "batched-ceiling", "--workers", "2", "--private-server", "--statements"]
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=REPO)
    print(done.stdout, done.stderr)
    if not _ships_pg_stat_statements(server_url):
        # The embedded PostgreSQL 18 has no pg_stat_statements: one line says so.
        assert done.returncode == 1
        assert "pg_stat_statements" in done.stderr and "Traceback" not in done.stderr
        return
    assert done.returncode == 0, done.stderr
    (run,) = json.loads((tmp_path / "throughput.json").read_text())["runs"]
    assert run["verified"]
    acks = [s for s in run["statements"] if s["query"].startswith("UPDATE") and "ANY" in s["query"]]
    (ack,) = acks
    # Every job acked, a batch per statement.
    assert ack["rows"] == 300 and ack["calls"] < 300
    assert ack["exec_us_per_job"] == pytest.approx(ack["total_exec_ms"] * 1000 / 300)


def test_statements_need_pg_stat_statements_loaded_by_the_server(
    server_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(server_url) as conn:
        loaded = conn.execute("SHOW shared_preload_libraries").fetchone()
    if loaded and "pg_stat_statements" in loaded[0]:
        pytest.skip("this server loads pg_stat_statements")
    command = [PGQUEUE, "bench", "throughput", "--jobs", "10", "--repeats", "1", "--statements"]
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 1
    assert "pg_stat_statements is not available on this server" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "throughput.json").exists()
