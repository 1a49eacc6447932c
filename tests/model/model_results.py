"""``results/model.json``: what a long run of the state-machine test exercised, per
PostgreSQL major version (a run on one version keeps the other's figures)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pgqueue_bench import results
from pgqueue_bench.infra import environment

RESULTS_NAME = "model"
REPOSITORY_RESULTS = Path(__file__).resolve().parents[2] / "results"


@dataclass
class ModelStatistics:
    """Counted by the state machine as it runs."""

    examples: int = 0
    """Sequences of steps, each on a schema emptied as new."""
    steps: int = 0
    """Rules run (enqueue, claim, ack, ...)."""
    invariant_checks: int = 0
    """Comparisons of the whole database with the model, each after a step."""
    rules: dict[str, int] = field(default_factory=dict)
    """Steps per rule, by name: what the run exercised, and how often."""
    outcomes: dict[str, int] = field(default_factory=dict)
    """How the steps of some rules went, by name (a completion committed, refused with
    LeaseLost...): which of a rule's branches the run reached, and how often."""

    def count(self, outcome: str) -> None:
        """Count one ``outcome`` of a step."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def write_model_results(
    statistics: ModelStatistics, server_version: int, seconds: float, runs: int
) -> Path:
    """Record this run's figures under its server version; return the file's path."""
    folder = results.results_dir(
        None if "PGQUEUE_RESULTS_DIR" in os.environ else REPOSITORY_RESULTS
    )
    document = results.read(RESULTS_NAME, folder) or {}
    by_version = document.get("postgresql", {})
    by_version[str(server_version)] = {
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "hypothesis_runs": runs,
        "failures": 0,
        **asdict(statistics),
        "rules": dict(sorted(statistics.rules.items())),
        "outcomes": dict(sorted(statistics.outcomes.items())),
    }
    document.update(
        {
            "benchmark": RESULTS_NAME,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "description": (
                "The Hypothesis state machine of tests/model run for a fixed time "
                "(nox -s model): examples (each on a schema emptied as new), steps (rules run), "
                "invariant checks (the whole database compared with the model after each "
                "step) and the steps of each rule. The run stops at its first failure, so a "
                "recorded run had none."
            ),
            "environment": {
                "machine": environment.machine(),
                "packages": environment.package_versions(),
            },
            "postgresql": by_version,
        }
    )
    return results.write(RESULTS_NAME, document, folder)
