"""Defaults shared by every pgqueue component, and where the database URL comes from."""

from __future__ import annotations

import os
import re

from pgqueue.errors import NoDatabaseConfigured, ValidationError

DEFAULT_SCHEMA = "pgqueue"
DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_LEASE_SECONDS = 30.0

_SCHEMA_PATTERN = re.compile(r"^[a-z_][a-z0-9_]{0,46}$")


def check_schema(schema: str) -> str:
    """A schema name: lower-case letters, digits and '_', at most 47 characters.

    The limit leaves room for the ``_jobs_done`` suffix of the NOTIFY channels within
    PostgreSQL's 63-byte identifiers.
    """
    if not isinstance(schema, str) or not _SCHEMA_PATTERN.match(schema):
        raise ValidationError(
            "schema", "must be 1-47 lower-case letters, digits or '_', not starting with a digit"
        )
    return schema


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which new jobs in ``schema`` are announced."""
    return f"{schema}_jobs"


def done_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which the jobs of ``schema`` that someone waits for
    (see :mod:`pgqueue.job_watch`) are announced as they finish, by id: the jobs
    channel's name with ``_done`` added, which SQL functions that are given the jobs
    channel derive the same way. Within 63 bytes for any schema name allowed."""
    return f"{notify_channel(schema)}_done"


def resolve_database_url(explicit: str | None = None) -> str:
    """The database to use: the explicit URL, else ``DATABASE_URL``, else a running
    embedded PostgreSQL in ``./.pgdata``. Raises :class:`NoDatabaseConfigured` if none."""
    if explicit:
        return explicit
    from_env = os.environ.get("DATABASE_URL")
    if from_env:
        return from_env
    from pgqueue import embedded

    running = embedded.running_url()
    if running:
        return running
    raise NoDatabaseConfigured()
