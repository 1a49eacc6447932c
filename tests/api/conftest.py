"""Fixtures for the HTTP API tests: the real app, served by uvicorn on a loopback port,
on this test's freshly migrated schema, and httpx clients talking to it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import psycopg
import pytest
from api_support import RunningApi
from psycopg import sql
from serving import serve

from pgqueue import migrate
from pgqueue_api import ApiSettings, create_app


@pytest.fixture
def start_api(database_url: str, schema: str) -> Iterator[Callable[..., RunningApi]]:
    """Start the API on this test's schema; keyword arguments override ApiSettings."""
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningApi:
            options: dict[str, Any] = {"database_url": database_url, "schema": schema}
            options.update(overrides)
            app = create_app(ApiSettings(**options))
            url = stack.enter_context(serve(app))
            client = stack.enter_context(httpx.Client(base_url=url, timeout=60))
            return RunningApi(url=url, client=client, app=app)

        yield start


@pytest.fixture
def api(start_api: Callable[..., RunningApi]) -> httpx.Client:
    """A client of an open API (no tokens) on this test's schema."""
    return start_api().client


@pytest.fixture(scope="module")
def module_schema(database_url: str) -> Iterator[str]:
    """A migrated schema shared by one test module, for tests that store nothing."""
    name = f"m_{uuid.uuid4().hex[:12]}"
    migrate(database_url, name)
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def module_api(database_url: str, module_schema: str) -> Iterator[httpx.Client]:
    """A client of an open API on the module's shared schema."""
    app = create_app(ApiSettings(database_url=database_url, schema=module_schema))
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client
