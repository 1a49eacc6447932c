"""The effects driver (``pgqueue bench effects``), as a user runs it, briefly: a private
cluster of the suite's PostgreSQL version, real ``pgqueue worker`` processes, the four
faults, and a handler that completes its job in the transaction of its write leaving
exactly one row per job, into a scratch folder (never over ``results/``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue_bench.infra.binaries import binaries_for
from pgqueue_bench.scenarios.effects.driver import FAULT_KINDS

pytestmark = [pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")
JOBS = 100


@pytest.mark.timeout(600)
def test_under_chaos_a_fenced_handlers_rows_are_one_per_job(
    server_url: str, tmp_path: Path
) -> None:
    # Enough work on few slots that the jobs outlast a round of the four faults.
    command = [PGQUEUE, "bench", "effects", "--jobs", str(JOBS), "--workers", "2"]
    command += ["--concurrency", "2", "--lease-seconds", "1", "--work-ms", "200-400"]
    command += ["--fault-every", "0.5-1", "--seed", "7", "--timeout", "400"]
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=560, cwd=REPO)
    said = f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    document = json.loads((tmp_path / "effects.json").read_text())
    summary, [run] = document["summary"], document["runs"]
    assert done.returncode == (0 if summary["passed"] else 1), said

    # On a private cluster of the suite's major version, which it crashed on purpose.
    postgresql = document["environment"]["postgresql"]
    assert postgresql["major"] == binaries_for(server_url).major, postgresql
    assert postgresql["server"].startswith("private cluster"), postgresql
    assert set(run["faults_injected"]) == set(FAULT_KINDS), run["faults_injected"]
    assert run["faults_failed"] == [], run["faults_failed"]

    # Every job succeeded, none was completed twice, and the fenced handler's rows are
    # exactly one per job, either way it completed.
    assert summary["every_job_succeeded"], said
    assert run["completed_twice"] == 0 and run["lost"] == 0, run
    fenced, plain = run["handlers"]["fenced"], run["handlers"]["plain"]
    assert (summary["fenced_missing"], summary["fenced_duplicated"]) == (0, 0), fenced
    assert fenced["rows"] == fenced["jobs_succeeded"] == JOBS, fenced
    for way, figures in fenced["by_way"].items():
        assert (figures["missing"], figures["duplicated"]) == (0, 0), (way, figures)
        assert figures["rows"] == figures["jobs"] == JOBS // 2, (way, figures)
    # The faults reached the handlers: some ran more than once.
    assert fenced["handler_runs"] + plain["handler_runs"] > 2 * JOBS, run["handlers"]
    # The plain handler loses nothing either; what it duplicates is at-least-once's.
    assert plain["missing"] == 0 and plain["rows"] == JOBS + plain["duplicated"], plain
    assert summary["plain_duplicated"] == plain["duplicated"]
    assert summary["passed"], said
