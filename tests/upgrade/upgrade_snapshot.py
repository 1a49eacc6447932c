"""Jobs as plain JSON values, read by either release of pgqueue.

The upgrade test reads the jobs with the previous release before the upgrade (the new
code's statements may need the new schema) and with the new code after it, and
compares the two. Both go through :func:`snapshot`: the previous release's Python runs
this file as a script (``python -I upgrade_snapshot.py URL SCHEMA ID...`` prints the
jobs as JSON), so it uses nothing but the standard library and ``Queue.connect`` and
``Queue.get``, which every release has.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import uuid
from datetime import UTC, datetime
from typing import Any


def plain(value: Any) -> Any:
    """``value`` as JSON would carry it, times in UTC so that both sides agree."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def snapshot(queue: Any, ids: list[int]) -> dict[str, dict[str, Any]]:
    """Each job of ``ids`` (``queue`` is a pgqueue Queue) as a dict of its fields, by id
    (as text, the way JSON keys come back)."""
    jobs = {}
    for job_id in ids:
        job = queue.get(job_id)
        jobs[str(job_id)] = {
            field.name: plain(getattr(job, field.name)) for field in dataclasses.fields(job)
        }
    return jobs


def main(argv: list[str]) -> None:
    from pgqueue import Queue

    url, schema, *ids = argv
    queue = Queue.connect(url, schema=schema, min_size=1, max_size=1)
    try:
        print(json.dumps(snapshot(queue, [int(job_id) for job_id in ids])))
    finally:
        queue.close()


if __name__ == "__main__":
    main(sys.argv[1:])
