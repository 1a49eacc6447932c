"""What the dashboard's templates show, computed from ``Queue`` results: the finished
jobs chart, pretty JSON cut to a readable size, ages and a job's timeline."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgqueue import Job, JobState
from pgqueue.jsonb import UndecodableJson
from pgqueue.queue_metrics import FinishedMinute

CHART_MINUTES = 60
CHART_WIDTH = 240
CHART_HEIGHT = 40
JSON_SHOWN_CHARS = 10_000
"""Longer payloads and results are cut on the job's page, with a link to all of it."""


@dataclass
class Bar:
    """One minute of the chart: a succeeded bar with the failed part stacked on it."""

    x: float
    width: float
    y: float
    height: float
    failed_y: float
    failed_height: float
    title: str


@dataclass
class Chart:
    """Jobs finished per minute over the last hour, as SVG bars."""

    bars: list[Bar] = field(default_factory=list)
    total: int = 0
    failed: int = 0
    peak: int = 0
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


def finished_charts(
    rows: Iterable[FinishedMinute], now: datetime | None = None
) -> dict[str, Chart]:
    """Per queue, a chart of ``Queue.finished_per_minute`` rows: the last CHART_MINUTES
    minutes, the current one last; succeeded jobs below, dead and cancelled above."""
    end = (now or datetime.now(UTC)).replace(second=0, microsecond=0)
    start = end - timedelta(minutes=CHART_MINUTES - 1)
    counts: dict[str, list[list[int]]] = {}
    for row in rows:
        index = int((row.minute - start).total_seconds() // 60)
        if not 0 <= index < CHART_MINUTES:
            continue  # the database's clock is a little ahead of or behind ours
        minutes = counts.setdefault(row.queue, [[0, 0] for _ in range(CHART_MINUTES)])
        minutes[index][0 if row.state == JobState.SUCCEEDED.value else 1] += row.jobs
    charts = {}
    slot = CHART_WIDTH / CHART_MINUTES
    for queue, minutes in counts.items():
        peak = max(sum(minute) for minute in minutes)
        chart = Chart(peak=peak)
        for index, (succeeded, failed) in enumerate(minutes):
            chart.total += succeeded + failed
            chart.failed += failed
            if succeeded + failed == 0:
                continue
            scale = (CHART_HEIGHT - 2) / peak
            height = max(1.0, succeeded * scale) if succeeded else 0.0
            failed_height = max(1.0, failed * scale) if failed else 0.0
            y = CHART_HEIGHT - height
            when = start + timedelta(minutes=index)
            chart.bars.append(
                Bar(
                    x=round(index * slot, 2),
                    width=round(slot - 1, 2),
                    y=round(y, 2),
                    height=round(height, 2),
                    failed_y=round(y - failed_height, 2),
                    failed_height=round(failed_height, 2),
                    title=f"{when:%H:%M} UTC: {succeeded} succeeded, {failed} failed",
                )
            )
        charts[queue] = chart
    return charts


def age(seconds: float | None) -> str:
    """A duration for people: 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def when(value: datetime | str | None) -> str:
    """A timestamp in UTC, to the millisecond."""
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
        value = parsed
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def until(value: datetime | None) -> str:
    """When a throttle ends, as :func:`when` writes it; empty for none, or one over."""
    if value is None or value <= datetime.now(UTC):
        return ""
    return when(value)


def limit_value(value: float | None) -> str:
    """A queue limit as a form field's value: the number itself, every digit of it
    (Python's shortest round-trip text), so that the field, sent back unchanged, reads
    as the same number; empty for no limit. A whole number loses its ``.0``."""
    if value is None:
        return ""
    text = repr(value)
    return text.removesuffix(".0")


def local_time(value: datetime | None, zone: str) -> str:
    """A timestamp in the time zone ``zone`` (a schedule's), to the minute."""
    if value is None:
        return ""
    try:
        return value.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z")
    except (ZoneInfoNotFoundError, ValueError):
        return ""


@dataclass
class ShownJson:
    """A JSON value, pretty, and cut to JSON_SHOWN_CHARS characters."""

    text: str
    total_chars: int
    truncated: bool
    undecodable: str | None = None
    """Why the stored value could not be decoded, when it could not: ``text`` is then
    its text as stored."""


def pretty_json(value: Any, limit: int = JSON_SHOWN_CHARS) -> ShownJson:
    """``value`` indented for reading; the template escapes it. A value Python could
    not load (written by another client, or by hand) is shown as it is stored."""
    undecodable = value.reason if isinstance(value, UndecodableJson) else None
    if undecodable is not None:
        text = str(value)
    else:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) <= limit:
        return ShownJson(text, len(text), False, undecodable)
    return ShownJson(text[:limit], len(text), True, undecodable)


@dataclass
class Event:
    """One line of a job's timeline."""

    at: str
    what: str
    detail: str = ""
    worker: str = ""
    kind: str = "info"


def _attempt_errors(job: Job) -> list[dict[str, Any]]:
    """The entries of ``job``'s error history that are what pgqueue writes: a history
    Python could not load, or entries another client wrote otherwise, are left to the
    page's error history, which shows them as they are."""
    history: object = job.errors
    if not isinstance(history, list):
        return []
    return [entry for entry in history if isinstance(entry, dict)]


def timeline(job: Job) -> list[Event]:
    """What happened to ``job``, in order: enqueued, due, each failed attempt (from its
    errors history), the latest attempt's start and how it ended."""
    events = [Event(when(job.enqueued_at), "enqueued")]
    if job.run_at > job.enqueued_at + timedelta(seconds=1):
        # After a failed attempt, run_at is when the retry is due.
        events.append(Event(when(job.run_at), "retry due" if job.errors else "due to run"))
    for error in _attempt_errors(job):
        events.append(
            Event(
                when(error.get("failed_at")),
                f"attempt {error.get('attempt', '?')} failed",
                str(error.get("error", "")),
                str(error.get("worker_id") or ""),
                "failed",
            )
        )
    if job.started_at is not None:
        events.append(
            Event(
                when(job.started_at),
                f"attempt {job.attempts} started",
                worker=job.worker_id or "",
                kind="running",
            )
        )
    if job.finished_at is not None:
        detail = job.last_error or "" if job.state is not JobState.SUCCEEDED else ""
        events.append(Event(when(job.finished_at), job.state.value, detail, kind=job.state.value))
    events.sort(key=lambda event: event.at)
    return events
