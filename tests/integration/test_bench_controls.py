"""The queue-controls driver (``pgqueue bench controls``) on real PostgreSQL: a
``--quick`` run of the real command, with real worker processes, writes a document
whose figures are the ones pgqueue promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


def test_a_quick_run_measures_pause_resume_and_both_limits(
    database_url: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [PGQUEUE, "bench", "controls", "--quick", "--database-url", database_url,
         "--results-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((tmp_path / "controls.json").read_text())
    summary = document["summary"]
    assert summary["pause_to_quiet_ms"]["runs"] == document["parameters"]["cycles"]
    # A pause stops starts within a second; a resume is acted on at once (NOTIFY).
    assert summary["pause_to_quiet_ms"]["max"] < 1000
    assert summary["resume_to_first_start_ms"]["median"] < 1000
    assert summary["concurrency_limit"]["held"]
    assert summary["concurrency_limit"]["most_running"] <= summary["concurrency_limit"]["limit"]
    assert 0.8 <= summary["rate_limit"]["ratio_to_limit"] <= 1.2
