"""The handlers and tests of docs/handlers.md's "Effects that happen once" run as
printed: the two files are taken from the page, and their tests run in a pytest of
their own, on the server under test, through pytest-pgqueue."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "handlers.md"

pytestmark = pytest.mark.slow


def file_on_page(name: str) -> str:
    """The code block that follows the line naming ``name`` on the page."""
    match = re.search(
        rf"^`{re.escape(name)}`\n\n```python\n(.*?)^```$", PAGE.read_text(), re.S | re.M
    )
    assert match, f"{name} is not on {PAGE.name}"
    return match.group(1)


def test_the_pages_shop_tasks_pass_their_own_tests(server_url: str, tmp_path: Path) -> None:
    for name in ("shop_tasks.py", "test_shop_tasks.py"):
        (tmp_path / name).write_text(file_on_page(name))
    env = {
        **os.environ,
        "DATABASE_URL": server_url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_shop_tasks.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout, run.stdout
