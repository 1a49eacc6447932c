"""The wait driver (``pgqueue bench wait``), as a user runs it, briefly: a real
``pgqueue-api`` answering ``?wait`` requests as their jobs are acked, into a scratch
folder (never over ``results/``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


def test_waits_are_answered_and_their_cost_recorded(database_url: str, tmp_path: Path) -> None:
    command = [PGQUEUE, "bench", "wait", "--rounds", "3", "--waiters", "20"]
    command += ["--database-url", database_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    document = json.loads((tmp_path / "wait.json").read_text())
    single, many = document["summary"]["single_wait"], document["summary"]["many_waits"]
    assert single["rounds"] == 3 and len(document["runs"][0]["single_waits_seconds"]) == 3
    assert 0 <= single["ms_median"] <= single["ms_p95"] <= single["ms_max"]
    # Every wait was answered after its ack, and the waits held no connection each.
    assert 0 <= many["first_answer_after_ack_seconds"] <= many["last_answer_after_ack_seconds"]
    assert many["api_connections_while_waiting"] < many["api_connections_idle"] + 20
