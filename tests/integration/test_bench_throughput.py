"""The throughput driver (``pgqueue bench throughput``) on real PostgreSQL: real
``pgqueue worker`` processes and the original design's naive loop drain the same jobs,
each run verified and measured with its CPU per job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.slow

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
