"""Writing and reading the JSON documents under ``results/``.

Every document has the same top level: ``benchmark`` (its name), ``created_at``,
``environment`` (see :mod:`pgqueue_bench.infra.environment`), ``parameters``, then what the
benchmark measured: for most, ``runs`` (one entry per repeat) and ``summary`` (the
spread over the runs); for the soak, one long run's ``samples``, ``faults`` and
``verdict``.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

DEFAULT_RESULTS_DIR = Path("results")


def spread(values: Iterable[float]) -> dict[str, float | int | None]:
    """Median, min and max of ``values`` (one per run), and how many runs."""
    numbers = [float(v) for v in values if v is not None]
    if not numbers:
        return {"median": None, "min": None, "max": None, "runs": 0}
    return {
        "median": statistics.median(numbers),
        "min": min(numbers),
        "max": max(numbers),
        "runs": len(numbers),
    }


def results_dir(directory: Path | str | None = None) -> Path:
    """Where results go: the argument, ``PGQUEUE_RESULTS_DIR``, or ./results."""
    chosen = directory or os.environ.get("PGQUEUE_RESULTS_DIR") or DEFAULT_RESULTS_DIR
    return Path(chosen)


def document(
    benchmark: str,
    *,
    environment: dict[str, Any],
    parameters: dict[str, Any],
    **measured: Any,
) -> dict[str, Any]:
    """A results document with the common top level, then ``measured`` (``runs`` and
    ``summary``, or what the benchmark has instead), in the order given."""
    return {
        "benchmark": benchmark,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment,
        "parameters": parameters,
        **measured,
    }


def record(
    name: str,
    environment: dict[str, Any],
    *,
    parameters: dict[str, Any],
    runs: list[dict[str, Any]],
    summary: dict[str, Any],
    directory: Path | str | None = None,
    benchmark: str | None = None,
) -> Path:
    """Write the document of a driver's ``runs`` and their ``summary`` (its benchmark
    ``benchmark``, else ``name``) to ``<results dir>/<name>.json``, say where, and
    return the path."""
    content = document(
        benchmark or name,
        environment=environment,
        parameters=parameters,
        runs=runs,
        summary=summary,
    )
    path = write(name, content, directory)
    click.echo(f"wrote {path}")
    return path


def write(name: str, content: dict[str, Any], directory: Path | str | None = None) -> Path:
    """Write ``content`` to ``<results dir>/<name>.json`` atomically; return the path."""
    return write_to(results_dir(directory) / f"{name}.json", content)


def write_to(path: Path, content: dict[str, Any]) -> Path:
    """Write ``content`` to ``path`` atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(content, indent=2, default=_json_default) + "\n")
    partial.replace(path)
    return path


def read(name: str, directory: Path | str | None = None) -> dict[str, Any] | None:
    """The document ``<results dir>/<name>.json``, or None if there is none."""
    path = results_dir(directory) / f"{name}.json"
    if not path.exists():
        return None
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in a results file")
