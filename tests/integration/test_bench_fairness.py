"""The fairness driver (``pgqueue bench fairness``), as a user runs it, briefly: real
``pgqueue worker`` processes drain a large tenant's backlog beside small tenants in
every phase, into a scratch folder (never over ``results/``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


def test_a_quick_run_measures_every_phase_and_every_tenant(
    database_url: str, tmp_path: Path
) -> None:
    command = [PGQUEUE, "bench", "fairness", "--quick", "--big-jobs", "600"]
    command += ["--small-tenants", "2", "--small-jobs", "4", "--partition-limit", "4"]
    command += ["--database-url", database_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=REPO)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    document = json.loads((tmp_path / "fairness.json").read_text())
    runs = {run["phase"]: run for run in document["runs"]}
    assert sorted(runs) == ["alone", "fair-share", "fifo", "partition-limit"]
    for phase, run in runs.items():
        # Every job succeeded at its first attempt.
        assert run["verified"], (phase, run)
    # Alone, each small tenant ran all its jobs, and nothing else ran.
    assert {t: f["jobs"] for t, f in runs["alone"]["tenants"].items()} == {
        "small-1": 4,
        "small-2": 4,
    }
    for phase in ("fifo", "fair-share", "partition-limit"):
        run = runs[phase]
        tenants = run["tenants"]
        assert tenants["big"]["jobs"] == 600, phase
        # The trickle stops with the backlog, but each small tenant enqueues one job.
        assert 1 <= tenants["small-1"]["jobs"] <= 4 and 1 <= tenants["small-2"]["jobs"] <= 4
        assert run["jobs"] == 600 + tenants["small-1"]["jobs"] + tenants["small-2"]["jobs"]
        assert run["jobs_per_second"] > 0 and run["backlog_seconds"] > 0, phase
        # A share (a fast machine claims so short a backlog before the first small job).
        assert 0 <= run["small_jobs_enqueued_during_backlog"] <= 1, phase
    summary = document["summary"]
    # Every phase was paired with the others of its repeat: each target was measured.
    assert [target["holds"] is not None for target in summary["targets"]] == [True, True]
    assert summary["p99_over_alone"]["fair-share"]["small-2"]["runs"] == 1
    assert document["parameters"]["partition_limit"] == 4
    assert (tmp_path / "fairness.png").stat().st_size > 0
    # Each phase's schema is dropped with its run.
    with psycopg.connect(database_url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench\\_fairness\\_%'"
        ).fetchone()
    assert left == (0,)
