"""The soak, three minutes of it: ``pgqueue bench soak`` as a user runs it, with a fault
every 20-40 s, on a private cluster of the suite's PostgreSQL version (the embedded 18,
or ``DATABASE_URL``'s), into a scratch folder (never over ``results/``). One of the
suite's long runs (marked ``long``): CI runs it on its PostgreSQL 18 leg, and its
faults one by one on both versions in tests/faults.

Three minutes cannot pin down a slope the way an hour does: the command judges a run
this short by looser flatness bounds (it says so in the verdict's ``bounds.note``), and
this test holds it to what three minutes can show for certain: nothing lost, nothing
completed twice, jobs finishing again after every fault it injected, and the samples
all there. How fast throughput came back is judged by the hour's verdict, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue_bench.infra import netns
from pgqueue_bench.infra.binaries import binaries_for

pytestmark = [pytest.mark.slow, pytest.mark.long]

MINUTES = 3
SAMPLE_SECONDS = 5
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


def items_by_name(document: dict) -> dict[str, dict]:
    return {item["name"]: item for item in document["verdict"]["items"]}


@pytest.mark.timeout(900)
def test_three_minutes_of_chaos_lose_nothing_complete_nothing_twice_and_recover(
    tmp_path: Path,
) -> None:
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(f"the blackhole fault needs a network namespace: {reason}")
    output, plot = tmp_path / "soak.json", tmp_path / "soak.png"
    command = [PGQUEUE, "bench", "soak", "--minutes", str(MINUTES), "--fault-every", "20-40"]
    command += ["--sample-seconds", str(SAMPLE_SECONDS), "--seed", "3"]
    command += ["--output", str(output), "--plot", str(plot)]
    finished = subprocess.run(
        command, capture_output=True, text=True, timeout=840, env=os.environ.copy()
    )
    said = f"exit {finished.returncode}\n{finished.stdout[-4000:]}\n{finished.stderr[-4000:]}"
    assert output.exists(), said
    document = json.loads(output.read_text())
    verdict, items = document["verdict"], items_by_name(document)
    # The suite's PostgreSQL version, on a private cluster of its own.
    postgresql = document["environment"]["postgresql"]
    assert postgresql["major"] == binaries_for(os.environ.get("DATABASE_URL")).major, postgresql
    assert postgresql["server"].startswith("private cluster"), postgresql

    # The exit status is the verdict's, and each failed item has its own line.
    assert finished.returncode == (0 if verdict["passed"] else 1), said
    for name in verdict["failed"]:
        assert "soak verdict failed:" in finished.stderr and name in finished.stderr, said

    # At-least-once, from the audit trail against the producers' acknowledgements.
    audit = document["audit"]
    assert audit["acknowledged_enqueues"] > 500, audit
    assert audit["schedule_ticks"] > 0, audit
    for name in ("lost", "completed_twice", "unfinished_after_drain", "jobs_nobody_enqueued"):
        assert items[name]["passed"] is True and items[name]["value"] == 0, items[name]
    assert items["worker_evidence"]["passed"] is True, items["worker_evidence"]
    # A worker SIGKILLed between an ack's commit and its log line logs one ack fewer.
    assert 0 < audit["acks_logged_by_workers"] <= audit["acks_committed"], audit

    # Faults were injected, each recorded on the database clock, and after every one of
    # them jobs finished again (how fast is the benchmark's verdict, not this test's: a
    # time bound would fail on a loaded machine without anything being broken).
    faults = document["faults"]
    assert faults and items["faults_injected"]["passed"] is True, faults
    samples = [s for s in document["samples"] if s["missing"] is None]
    for fault in faults:
        assert fault["error"] is None and fault["start_clock"] == "database", fault
        assert fault["started_at"] <= fault["ended_at"], fault
        after = [s for s in samples if s["elapsed_seconds"] > fault["end_elapsed_seconds"]]
        assert any(s["finished"] > 0 for s in after), (fault, after)

    # The samples are all there, with every series in them.
    expected = MINUTES * 60 // SAMPLE_SECONDS
    assert len(samples) >= 0.9 * expected, len(samples)
    for sample in samples[1:]:
        assert sample["throughput_per_second"] is not None, sample
        assert {"active_jobs", "finished_jobs"} <= set(sample["tables"]), sample
        assert sample["connections"]["total"] > 0, sample
        assert any(label.startswith("api") for label in sample["rss_mib"]), sample
        assert sum(label.startswith("worker") for label in sample["rss_mib"]) >= 3, sample
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
