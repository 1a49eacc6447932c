"""What an API process needs to know: its database, who may call it, and its limits.

Settings come from environment variables (:meth:`ApiSettings.from_env`): the command line
turns its flags into them before it starts uvicorn, so every worker process, which
imports the app by name, builds the same settings. Each flag also reads the variable it
writes (``--max-body-bytes`` reads ``PGQUEUE_API_MAX_BODY_BYTES``), so a variable set by
hand reaches the app unless a flag overrides it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pgqueue import validation
from pgqueue.settings import DEFAULT_SCHEMA, check_schema, resolve_database_url

DEFAULT_MAX_BODY_BYTES = validation.PAYLOAD_MAX_BYTES + 65_536
"""Room for the largest payload the queue takes, and the job's other fields around it."""
DEFAULT_POOL_SIZE = 10
DEFAULT_POOL_TIMEOUT = 5.0
DEFAULT_HEALTH_TIMEOUT = 2.0

# The environment variables behind each setting. DATABASE_URL, PGQUEUE_SCHEMA and
# PGQUEUE_API_TOKENS are also what people set by hand.
ENV_DATABASE_URL = "DATABASE_URL"
ENV_SCHEMA = "PGQUEUE_SCHEMA"
ENV_TOKENS = "PGQUEUE_API_TOKENS"
ENV_TOKEN_FILE = "PGQUEUE_API_TOKEN_FILE"
ENV_PUBLIC_METRICS = "PGQUEUE_API_PUBLIC_METRICS"
ENV_MAX_BODY_BYTES = "PGQUEUE_API_MAX_BODY_BYTES"
ENV_POOL_SIZE = "PGQUEUE_API_POOL_SIZE"
ENV_PREPARE = "PGQUEUE_API_PREPARE"
ENV_REJECT_UNSERVED_TASKS = "PGQUEUE_API_REJECT_UNSERVED_TASKS"
ENV_NO_UI = "PGQUEUE_API_NO_UI"

_TRUE = {"1", "true", "yes", "on"}


class SettingsError(ValueError):
    """A setting has a value the API cannot run with."""


@dataclass(frozen=True)
class ApiSettings:
    """Settings of one API process."""

    database_url: str
    schema: str = DEFAULT_SCHEMA
    tokens: frozenset[str] = field(default_factory=frozenset)
    """Bearer tokens that may call the API; empty means the API is open."""
    public_metrics: bool = False
    """Serve ``/metrics`` without a token even when tokens are configured."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    pool_size: int = DEFAULT_POOL_SIZE
    """Database connections per API process, at most (see :attr:`enqueue_pool_size`)."""
    pool_timeout: float = DEFAULT_POOL_TIMEOUT
    """How long a request waits for a free database connection before it gets 503."""
    prepare: bool = True
    """Server-side prepared statements; off behind PgBouncer in transaction mode."""
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT
    """How long ``/healthz`` waits for the database before it answers 503."""
    reject_unserved_tasks: bool = False
    """Refuse (422) a job whose task no live worker serves in its queue (see
    :mod:`pgqueue_api.unserved`)."""
    ui: bool = True
    """Serve the dashboard under ``/ui`` (``--no-ui`` turns it off)."""

    def __post_init__(self) -> None:
        check_schema(self.schema)
        if self.max_body_bytes < 1:
            raise SettingsError("max_body_bytes must be at least 1")
        if self.pool_size < 2:
            raise SettingsError(
                "pool_size must be at least 2: one connection for single-job enqueues, "
                "one for every other request"
            )
        if any(not token or any(c.isspace() for c in token) for token in self.tokens):
            raise SettingsError("API tokens must be non-empty and contain no whitespace")

    @property
    def enqueue_pool_size(self) -> int:
        """The share of :attr:`pool_size` for single-job enqueues, on the event loop (see
        :class:`pgqueue.AsyncProducer`): half of it, rounded down."""
        return self.pool_size // 2

    @property
    def queue_pool_size(self) -> int:
        """The share of :attr:`pool_size` for every other request, in threads: the rest."""
        return self.pool_size - self.enqueue_pool_size

    @property
    def auth_required(self) -> bool:
        """True when requests need a bearer token."""
        return bool(self.tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiSettings:
        """Settings from environment variables (``DATABASE_URL``, ``PGQUEUE_SCHEMA``,
        ``PGQUEUE_API_TOKENS``, ``PGQUEUE_API_TOKEN_FILE``, ...)."""
        env = os.environ if environ is None else environ
        tokens = set(parse_token_list(env.get(ENV_TOKENS, "")))
        token_file = env.get(ENV_TOKEN_FILE)
        if token_file:
            tokens.update(read_token_file(Path(token_file)))
        return cls(
            database_url=env.get(ENV_DATABASE_URL) or resolve_database_url(None),
            schema=env.get(ENV_SCHEMA) or DEFAULT_SCHEMA,
            tokens=frozenset(tokens),
            public_metrics=is_true(env.get(ENV_PUBLIC_METRICS, "")),
            max_body_bytes=_int(env, ENV_MAX_BODY_BYTES, DEFAULT_MAX_BODY_BYTES),
            pool_size=_int(env, ENV_POOL_SIZE, DEFAULT_POOL_SIZE),
            prepare=is_true(env.get(ENV_PREPARE, "1")),
            reject_unserved_tasks=is_true(env.get(ENV_REJECT_UNSERVED_TASKS, "")),
            ui=not is_true(env.get(ENV_NO_UI, "")),
        )


def is_true(text: str) -> bool:
    """A switch's value from the environment: 1, true, yes or on (any case) is on."""
    return text.strip().lower() in _TRUE


def parse_token_list(text: str) -> list[str]:
    """Tokens from a comma-separated list, blanks ignored."""
    return [token.strip() for token in text.split(",") if token.strip()]


def read_token_file(path: Path) -> list[str]:
    """Tokens from a file, one per line; blank lines and lines starting with # are ignored."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SettingsError(f"cannot read token file {path}: {exc.strerror}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, not {value!r}") from None
