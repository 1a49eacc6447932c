"""A pgqueue plugin for the workflow tests, loaded with ``pgqueue worker --plugin``:
steps that return a number or die, and callbacks that report what ``job.dependencies``
held when they ran."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgqueue import Job, hookimpl


def number(payload: dict[str, Any]) -> int:
    """Return ``payload["n"]``."""
    return int(payload["n"])


def always_fails(payload: dict[str, Any]) -> None:
    """Fail every attempt."""
    raise RuntimeError("this step always fails")


def total(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """Sum the results of the jobs this one waited for, as a fan-in would (a number, or
    the sum of another total)."""
    results = [dependency.result for dependency in job.dependencies]
    return {
        "sum": sum(r["sum"] if isinstance(r, dict) else r for r in results),
        "ids": [dependency.id for dependency in job.dependencies],
    }


def report(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """What a batch callback sees: each dependency's id, task, state and result."""
    return {
        "dependencies": [
            {"id": d.id, "task": d.task, "state": d.state, "result": d.result, "pruned": d.pruned}
            for d in job.dependencies
        ]
    }


@hookimpl
def register_tasks(register: Callable[..., None]) -> None:
    register("number", number)
    register("always_fails", always_fails)
    register("total", total)
    register("report", report)
