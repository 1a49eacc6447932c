"""Fixtures for the dashboard tests: Debian's Chromium through Playwright, a real API
process on this test's schema, and a page that logs itself in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from ui_support import (
    CHROMIUM,
    TOKEN,
    ApiProcess,
    api_process,
    chromium,
    screenshots_dir,
    worker_process,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium from Debian's package. Missing, the test fails (it is part of
    the suite, which .ci/run installs it for), rather than being skipped unseen."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the dashboard tests drive Debian's Chromium "
            "(apt-get install -y chromium; .ci/run installs it)",
            pytrace=False,
        )
    with chromium() as browser:
        yield browser


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies) and page, 1280 pixels wide."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(30_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def start_api(
    database_url: str, schema: str, tmp_path: Path
) -> Iterator[Callable[..., ApiProcess]]:
    """Start ``pgqueue-api`` on this test's schema (``tokens=None`` for an open one)."""
    with ExitStack() as stack:

        def start(*args: str, tokens: str | None = TOKEN) -> ApiProcess:
            return stack.enter_context(
                api_process(database_url, schema, tmp_path, *args, tokens=tokens)
            )

        yield start


@pytest.fixture
def start_worker(database_url: str, schema: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start ``pgqueue worker`` on this test's schema; stopped after the test."""
    with ExitStack() as stack:
        yield lambda *args: stack.enter_context(
            worker_process(database_url, schema, tmp_path, *args)
        )


@pytest.fixture
def shoot() -> Callable[..., None]:
    """Save a screenshot of the whole page (or of the window) as results/ui/<name>.png."""

    def save(page: Any, name: str, full_page: bool = True) -> None:
        page.screenshot(path=str(screenshots_dir() / f"{name}.png"), full_page=full_page)

    return save
