"""The drain with partition keys (``python -m pgqueue_bench.peers --keys``), from
hand-built runs: each keyed system's rate over pgqueue's without keys, paired within
each repeat, against its target, and the section of the results page that shows them;
and the systems it runs, with what each one sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgqueue_bench.peers.summary import keyed_targets, summarize
from pgqueue_bench.peers.systems import described_settings, partition_variants
from pgqueue_bench.report import pages as report

ENVIRONMENT = {
    "machine": {"cpu_count": 2, "cpu_model": "AMD EPYC", "memory_gib": 23.5, "python": "3.11.7"},
    "postgresql": {"server": "DATABASE_URL", "version": "PostgreSQL 18.4", "settings": {}},
}
KEYED = [system.name for system in partition_variants(100)]


def _run(system: str, workers: int, repeat: int, rate: float, cpu: float) -> dict[str, Any]:
    return {
        "scenario": "throughput",
        "system": system,
        "workers": workers,
        "repeat": repeat,
        "jobs": 5000,
        "jobs_per_second": rate,
        "cpu_us_per_job": cpu,
        "verified": True,
        "problems": [],
    }


def _runs() -> list[dict[str, Any]]:
    fair, limited, rate_limited = KEYED
    return [
        _run("pgqueue", 1, 1, 1000.0, 500.0),
        _run(fair, 1, 1, 900.0, 550.0),
        _run(limited, 1, 1, 850.0, 600.0),
        _run(rate_limited, 1, 1, 700.0, 700.0),
        # The machine slowed for the second repeat: the pairs still compare alike.
        _run("pgqueue", 1, 2, 500.0, 500.0),
        _run(fair, 1, 2, 450.0, 550.0),
        _run(limited, 1, 2, 425.0, 600.0),
        _run(rate_limited, 1, 2, 350.0, 700.0),
    ]


def test_each_keyed_system_is_held_to_its_rate_over_the_drain_without_keys() -> None:
    summary = summarize(_runs(), ["pgqueue", *KEYED], "pgqueue")

    targets = {target["system"]: target for target in keyed_targets(summary, KEYED)}

    assert targets[KEYED[0]]["ratio"] == pytest.approx(0.9) and targets[KEYED[0]]["holds"]
    assert targets[KEYED[1]]["ratio"] == pytest.approx(0.85) and targets[KEYED[1]]["holds"]
    assert targets[KEYED[2]]["ratio"] == pytest.approx(0.7)
    assert targets[KEYED[2]]["holds"] is False
    assert {target["workers"] for target in targets.values()} == {1}
    cpu = summary["vs_baseline"]["cpu_per_job_ratios"]["1"]
    assert cpu[KEYED[2]]["median"] == pytest.approx(1.4)


def test_the_keyed_systems_say_what_they_set() -> None:
    fair, limited, rate_limited = partition_variants(100)

    assert fair.enqueue_setting_args() == ["--setting", "partition_keys=100"]
    assert fair.setting_args() == []
    assert limited.setting_args() == ["--setting", "queue_partition_concurrency_limit=10000"]
    assert rate_limited.setting_args() == ["--setting", "queue_partition_rate_limit=1000000"]
    described = described_settings(["pgqueue", *KEYED], 0.0, 100)
    assert "100 partition keys" in described[fair.name]
    assert "partition_rate_limit is 1e+06 jobs/s per key" in described[rate_limited.name]


def test_the_results_page_has_a_section_for_the_drain_with_keys(tmp_path: Path) -> None:
    runs = _runs()
    summary = summarize(runs, ["pgqueue", *KEYED], "pgqueue")
    summary["targets"] = keyed_targets(summary, KEYED)
    document = {
        "benchmark": "peers_partitions",
        "created_at": "2026-12-06T08:00:00+00:00",
        "environment": ENVIRONMENT,
        "parameters": {
            "jobs": 5000,
            "partition_keys": 100,
            "systems": described_settings(["pgqueue", *KEYED], 0.0, 100),
        },
        "runs": runs,
        "summary": summary,
    }
    (tmp_path / "peers_partitions.json").write_text(json.dumps(document))

    section = report.render(tmp_path).split("### The drain with partition keys", 1)[1]

    assert "spread over 100 keys" in section
    assert "| 1 | 750 (500-1,000) | 675 (450-900) (0.90x, 0.90-0.90) |" in section
    assert f"| {KEYED[2]}, 1 worker(s) | 0.70x | at least 0.8x | **no** |" in section
    assert f"| {KEYED[0]}, 1 worker(s) | 0.90x | at least 0.8x | yes |" in section
    assert "Raw data: `results/peers_partitions.json`." in section
