"""pgqueue's two log formats, shared by ``pgqueue worker`` and ``pgqueue-api``: text for
people, and one JSON object per line for log pipelines.

Each record's own fields (those a logger attached with ``extra=``, such as a job's
``job_id``) and the fields of its context (a request's ``request_id``) are keys of the
JSON object, and ``[key=value ...]`` after a text line, so a pipeline can filter on them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

Fields = Callable[[logging.LogRecord], Mapping[str, Any]]
"""The fields of a record's context, looked up as it is formatted."""


def record_fields(record: logging.LogRecord, names: Sequence[str]) -> dict[str, Any]:
    """The attributes ``names`` of ``record`` that are set (and not None)."""
    return {
        name: getattr(record, name) for name in names if getattr(record, name, None) is not None
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's ``fields``
    that are set, those of ``context``, ``static`` ones (a worker's id), and the
    traceback if there is one."""

    def __init__(
        self,
        fields: Sequence[str] = (),
        *,
        static: Mapping[str, Any] | None = None,
        context: Fields | None = None,
    ) -> None:
        super().__init__()
        self.fields = tuple(fields)
        self.static = dict(static or {})
        self.context = context

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **record_fields(record, self.fields),
        }
        if self.context is not None:
            document.update(self.context(record))
        document.update(self.static)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [key=value ...]``, with the record's ``fields`` and
    those of ``context`` in brackets."""

    def __init__(
        self,
        fields: Sequence[str] = (),
        *,
        context: Fields | None = None,
        fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s",
    ) -> None:
        super().__init__(fmt)
        self.fields = tuple(fields)
        self.context = context

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = record_fields(record, self.fields)
        if self.context is not None:
            fields.update(self.context(record))
        if not fields:
            return text
        head, newline, rest = text.partition("\n")  # keep a traceback below the line
        pairs = " ".join(f"{name}={value}" for name, value in fields.items())
        return f"{head} [{pairs}]{newline}{rest}"
