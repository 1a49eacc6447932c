"""``pgqueue queue list | pause | resume | set``: an operator's controls from the shell,
with one-line errors for a queue that never existed and for bad values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue import Queue, QueueInfo

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


@pytest.fixture
def run(database_url: str, schema: str):
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        db = ["--database-url", database_url, "--schema", schema]
        return subprocess.run([*PGQUEUE, *args, *db], capture_output=True, text=True, timeout=60)

    return run


def test_pause_resume_and_set_change_the_queue(queue: Queue, run) -> None:
    queue.enqueue("t", queue="mail")
    out = run("queue", "pause", "mail")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "queue mail: paused, concurrency limit -, rate limit -"
    out = run("queue", "set", "mail", "--concurrency-limit", "3", "--rate-limit", "2.5")
    assert out.stdout.strip() == "queue mail: paused, concurrency limit 3, rate limit 2.5/s"
    out = run("queue", "set", "mail", "--rate-limit", "none")
    assert out.stdout.strip() == "queue mail: paused, concurrency limit 3, rate limit -"
    out = run("queue", "resume", "mail")
    assert out.stdout.strip() == "queue mail: running, concurrency limit 3, rate limit -"
    assert queue.update_queue("mail") == QueueInfo("mail", False, 3, None)


def test_queue_list_shows_settings_and_counts(queue: Queue, run) -> None:
    queue.enqueue("t", queue="mail")
    queue.pause_queue("mail")
    queue.update_queue("later", rate_limit=5, create=True)
    out = run("queue", "list")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split()[:2] == ["queue", "paused"]
    assert [row.split() for row in rows] == [
        ["later", "no", "-", "5/s", "0", "0"],
        ["mail", "yes", "-", "-", "1", "0"],
    ]
    listed = json.loads(run("queue", "list", "--json").stdout)
    assert [(q["queue"], q["paused"], q["rate_limit"]) for q in listed] == [
        ("later", False, 5.0),
        ("mail", True, None),
    ]


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("queue", "pause", "nowhere"), 1, "queue 'nowhere' not found"),
        (("queue", "set", "mail", "--concurrency-limit", "-1"), 1, "must not be negative"),
        (("queue", "set", "mail", "--rate-limit", "0"), 1, "greater than 0"),
        (("queue", "set", "mail", "--rate-limit", "nan"), 2, "not a finite number"),
        (("queue", "set", "mail", "--concurrency-limit", "many"), 2, "not a whole number"),
    ],
)
def test_mistakes_are_one_line(queue: Queue, run, args, status: int, message: str) -> None:
    queue.enqueue("t", queue="mail")
    out = run(*args)
    assert out.returncode == status
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert queue.update_queue("mail") == QueueInfo("mail", False, None, None)


def test_create_configures_a_queue_before_its_first_job(queue: Queue, run) -> None:
    out = run("queue", "pause", "fresh", "--create")
    assert out.returncode == 0, out.stderr
    assert queue.pause_queue("fresh").paused
