"""The dashboard driver (``pgqueue bench ui``) at a tiny size on real PostgreSQL: a
real API process serves every page, each timed as often as asked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue_bench.scenarios.ui import Loaded, pages

pytestmark = [pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


def test_a_tiny_run_times_every_page_and_writes_its_results(server_url: str, tmp_path: Path):
    command = [PGQUEUE, "bench", "ui", "--finished", "2000", "--requests", "5"]
    command += ["--queued", "60", "--running", "10"]
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=REPO)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr

    document = json.loads((tmp_path / "ui.json").read_text())
    assert document["benchmark"] == "ui"
    assert document["parameters"]["finished"] == 2000
    assert document["parameters"]["requests"] == 5
    assert document["environment"]["postgresql"]["major"] >= 15
    summary = document["summary"]
    expected = {page.name for page in pages(Loaded(1, 1, "k"), None)}
    assert set(summary["pages"]) == expected
    for name, page in summary["pages"].items():
        assert page["requests"] == 5, name
        assert 0 < page["p50_ms"] <= page["p99_ms"] <= page["max_ms"], name
    # 2000 jobs at 100 a second all finished within the last hour.
    assert summary["first_load"]["last_hour"]["jobs"] == 2000
    assert summary["first_load"]["ui_ms"] > 0
    assert document["runs"][0]["history"]["rows"] == 2000
    assert "worst p99" in done.stdout


def test_more_running_than_queued_jobs_is_one_line(tmp_path: Path):
    command = [PGQUEUE, "bench", "ui", "--queued", "5", "--running", "6"]
    command += ["--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert "cannot be more than --queued" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ui.json").exists()
