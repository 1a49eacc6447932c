"""The README's side-by-side sections: the async-jobs run (``results/peers_async.json``)
gets a section of its own that says what its jobs do, beside the no-op one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pgqueue_bench.report import pages as report

ENVIRONMENT = {
    "machine": {"cpu_count": 2, "cpu_model": "AMD EPYC", "memory_gib": 23.5, "python": "3.11.7"},
    "postgresql": {"server": "DATABASE_URL", "version": "PostgreSQL 15.20", "settings": {}},
}


def _peers_document(sleep_ms: float | None) -> dict[str, Any]:
    rates = {"pgqueue": [9000.0, 8000.0, 10000.0], "pgqueuer": [3000.0, 4000.0, 3500.0]}
    runs = [
        {
            "scenario": "throughput",
            "system": system,
            "workers": 1,
            "jobs_per_second": rate,
            "verified": True,
        }
        for system, values in rates.items()
        for rate in values
    ]
    parameters: dict[str, Any] = {"jobs": 20000, "systems": {"pgqueue": "defaults"}}
    if sleep_ms is not None:
        parameters["sleep_ms"] = sleep_ms
    return {
        "benchmark": "peers_async" if sleep_ms else "peers",
        "environment": ENVIRONMENT,
        "parameters": parameters,
        "runs": runs,
        "summary": {
            "pgqueue_vs_fastest_peer": {
                "1": {"pgqueue": 9000.0, "fastest_peer": "pgqueuer", "ratio": 9000 / 3500}
            }
        },
    }


def test_the_async_run_has_a_section_of_its_own_that_names_its_jobs(tmp_path: Path) -> None:
    (tmp_path / "peers.json").write_text(json.dumps(_peers_document(None)))
    (tmp_path / "peers_async.json").write_text(json.dumps(_peers_document(20.0)))

    rendered = report.render(tmp_path)

    noop, _, async_part = rendered.partition("### pgqueue and its peers, 20 ms async jobs")
    assert async_part, rendered
    assert "20000 no-op jobs" in noop
    assert "awaits `asyncio.sleep(0.02)`" in async_part
    assert "| 1 | 9,000 (8,000-10,000) | 3,500 (3,000-4,000) | 2.6x |" in async_part
    assert "Raw data: `results/peers_async.json`." in async_part
