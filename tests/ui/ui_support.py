"""Helpers for the dashboard tests: a real ``pgqueue-api`` process, a real worker, and
Debian's Chromium driven by Playwright (never a browser Playwright downloads)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
from polling import wait_for
from processes import environment, start_worker, stop

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these, Chromium calls home at start, which a closed network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "ui-test-token-0123456789"
HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent.parent
PGQUEUE_API = Path(sys.executable).parent / "pgqueue-api"
# Short intervals, so that a worker picks jobs up and reports within a test.
FAST_WORKER = ["--poll-interval", "0.2", "--heartbeat-seconds", "0.5", "--lease-seconds", "5"]


# The one Chromium of this test process (see chromium): Playwright's sync API cannot
# run twice at once in one thread, and two conftests hand the browser out.
_chromium: dict[str, Any] = {}


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium from Debian's package, through Playwright: one per process,
    shared by every fixture that asks (the dashboard's and the security suite's), and
    closed when the last of them is done."""
    if not _chromium:
        from playwright.sync_api import sync_playwright

        manager = sync_playwright()
        playwright = manager.__enter__()
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        _chromium.update(manager=manager, browser=browser, users=0)
    _chromium["users"] += 1
    try:
        yield _chromium["browser"]
    finally:
        _chromium["users"] -= 1
        if not _chromium["users"]:
            _chromium["browser"].close()
            _chromium["manager"].__exit__(None, None, None)
            _chromium.clear()


def screenshots_dir() -> Path:
    """Where the screenshots go: PGQUEUE_RESULTS_DIR/ui, else the repository's
    results/ui (the README shows those)."""
    base = os.environ.get("PGQUEUE_RESULTS_DIR") or REPOSITORY / "results"
    folder = Path(base) / "ui"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def free_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class ApiProcess:
    """A running ``pgqueue-api``."""

    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def api_process(
    database_url: str, schema: str, log_dir: Path, *args: str, tokens: str | None = None
) -> Iterator[ApiProcess]:
    """``pgqueue-api`` on ``schema`` (with ``tokens``, comma-separated, if given), on a
    free port; stopped afterwards."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_API_")}
    env.pop("DATABASE_URL", None)
    if tokens:
        env["PGQUEUE_API_TOKENS"] = tokens
    log_path = log_dir / f"api-{port}.log"
    command = [str(PGQUEUE_API), "--port", str(port), "--database-url", database_url]
    command += ["--schema", schema, "--no-access-log", *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    running = ApiProcess(url, process, log_path)
    try:

        def healthy() -> bool:
            assert process.poll() is None, f"the API exited:\n{running.log()}"
            try:
                return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, timeout=60, interval=0.1, what="the API to answer")
        yield running
    finally:
        stop([process], timeout=30)


@contextmanager
def worker_process(
    database_url: str, schema: str, log_dir: Path, *args: str
) -> Iterator[subprocess.Popen]:
    """``pgqueue worker`` with the example plugin's tasks (echo, sleep, fail, flaky)."""
    command = ["--database-url", database_url, "--schema", schema, *FAST_WORKER, *args]
    process = start_worker(command, environment(HERE), log_dir / f"worker-{free_port()}.log")
    try:
        yield process
    finally:
        stop([process], timeout=30)


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no form with a CSRF token"
    return match[1]


@contextmanager
def logged_in_client(base_url: str) -> Iterator[httpx.Client]:
    """An httpx client that logged in through the login form, as a browser does."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        page = client.get("/ui/login")
        answer = client.post(
            "/ui/login", data={"csrf_token": csrf_of(page.text), "token": TOKEN, "next": "/ui"}
        )
        assert answer.status_code == 303, answer.text
        yield client


def log_in(page: Any, base_url: str, target: str = "/ui") -> None:
    """Open ``target``, which sends the browser to the login page, and log in there."""
    page.goto(base_url + target)
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Log in')")
    page.wait_for_url(base_url + target)


class _Forms(HTMLParser):
    """The input fields of every limits form on a page, by the queue each one is for."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, str]] = []
        self._current: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form" and attributes.get("action") == "/ui/queues/limits":
            self._current = {}
            self.forms.append(self._current)
        elif tag == "input" and self._current is not None and attributes.get("name"):
            self._current[str(attributes["name"])] = attributes.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._current = None


def limits_form(html: str, queue_name: str) -> dict[str, str]:
    """What a browser would submit from ``queue_name``'s limits form, left as shown."""
    parser = _Forms()
    parser.feed(html)
    (form,) = [form for form in parser.forms if form.get("queue") == queue_name]
    return form
