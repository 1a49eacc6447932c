"""The drain with partition keys (``python -m pgqueue_bench.peers --keys``), briefly:
pgqueue's default worker drains the same jobs without keys and spread over keys, with
and without partition limits that never bind, each run checked to have carried its
keys, into a scratch folder (never over ``results/``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]


def test_the_keyed_drains_are_measured_against_the_drain_without_keys(
    server_url: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "pgqueue_bench.peers", "--keys", "10", "--quick"]
    command += ["--jobs", "300", "--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=REPO)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    document = json.loads((tmp_path / "peers_partitions.json").read_text())
    keyed = [
        "pgqueue 10 keys",
        "pgqueue 10 keys partition-limited",
        "pgqueue 10 keys partition-rate-limited",
    ]
    runs = {run["system"]: run for run in document["runs"]}
    assert sorted(runs) == sorted(["pgqueue", *keyed])
    for name, run in runs.items():
        # Every job completed exactly once, and the keyed ones carried all 10 keys.
        assert run["verified"], (name, run["problems"])
        assert run["scenario"] == "throughput" and run["jobs"] == 300
    assert document["parameters"]["partition_keys"] == 10
    targets = document["summary"]["targets"]
    assert [(t["system"], t["workers"]) for t in targets] == [(name, 2) for name in keyed]
    assert all(t["ratio"] is not None and t["holds"] is not None for t in targets)
