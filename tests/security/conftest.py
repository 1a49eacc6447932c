"""Fixtures for the security tests of every surface: the real app served in-process by
uvicorn (as in tests/api) and the real ``pgqueue-api`` process (as in tests/ui), both
with an API token configured, and the dashboard's logged-in clients."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).resolve().parent
# The API and dashboard tests' helpers (the running app, the API process, logging in),
# shared rather than copied.
for folder in ("api", "ui"):
    if str(HERE.parent / folder) not in sys.path:
        sys.path.insert(0, str(HERE.parent / folder))

from api_support import RunningApi  # noqa: E402
from serving import serve  # noqa: E402
from ui_support import TOKEN, ApiProcess, api_process  # noqa: E402

from pgqueue_api import ApiSettings, create_app  # noqa: E402

# The dashboard tests' Chromium fixtures (``browser``, ``page``), from their conftest.
_spec = importlib.util.spec_from_file_location("ui_conftest", HERE.parent / "ui" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_ui_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ui_conftest)
browser = _ui_conftest.browser
page = _ui_conftest.page


@pytest.fixture
def start_app(database_url: str, schema: str) -> Iterator[Callable[..., RunningApi]]:
    """Serve ``create_app`` in this process on this test's schema, with ``TOKEN``
    configured; keyword arguments override ApiSettings."""
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningApi:
            options: dict[str, Any] = {
                "database_url": database_url,
                "schema": schema,
                "tokens": frozenset({TOKEN}),
            }
            options.update(overrides)
            app = create_app(ApiSettings(**options))
            url = stack.enter_context(serve(app))
            client = stack.enter_context(httpx.Client(base_url=url, timeout=60))
            return RunningApi(url=url, client=client, app=app)

        yield start


@pytest.fixture
def start_process(
    database_url: str, schema: str, tmp_path: Path
) -> Iterator[Callable[..., ApiProcess]]:
    """Start ``pgqueue-api`` on this test's schema with ``TOKEN``; extra arguments are
    passed on (the later of ``--no-access-log`` and ``--access-log`` wins)."""
    with ExitStack() as stack:

        def start(*args: str) -> ApiProcess:
            return stack.enter_context(
                api_process(database_url, schema, tmp_path, *args, tokens=TOKEN)
            )

        yield start
