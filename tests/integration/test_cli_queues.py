"""``pgqueue queue list | pause | resume | set``: an operator's controls from the shell,
with one-line errors for a queue that never existed and for bad values."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from datetime import UTC, datetime
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
        ["later", "no", "-", "5/s", "-", "-", "-", "0", "0"],
        ["mail", "yes", "-", "-", "-", "-", "-", "1", "0"],
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


def test_partition_limits_are_set_cleared_and_listed(queue: Queue, run) -> None:
    queue.enqueue("t", queue="mail")
    out = run(
        "queue",
        "set",
        "mail",
        "--partition-concurrency-limit",
        "2",
        "--partition-rate-limit",
        "0.5",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "queue mail: running, concurrency limit -, rate limit -, "
        "per-key concurrency limit 2, per-key rate limit 0.5/s"
    )
    info = queue.update_queue("mail")
    assert (info.partition_concurrency_limit, info.partition_rate_limit) == (2, 0.5)
    # Another limit alone leaves the partition limits be.
    out = run("queue", "set", "mail", "--concurrency-limit", "9")
    assert out.stdout.strip().endswith("per-key concurrency limit 2, per-key rate limit 0.5/s")
    queue.throttle("mail", 600)
    header, row = run("queue", "list").stdout.splitlines()
    assert "per-key limit" in header and "throttled until" in header
    cells = row.split()
    assert cells[:6] == ["mail", "no", "9", "-", "2", "0.5/s"]
    assert datetime.fromisoformat(cells[6]) > datetime.now(UTC)
    [listed] = json.loads(run("queue", "list", "--json").stdout)
    assert (listed["partition_concurrency_limit"], listed["partition_rate_limit"]) == (2, 0.5)
    assert listed["throttled_until"] is not None

    out = run("queue", "set", "mail", "--partition-concurrency-limit", "none")
    assert out.returncode == 0, out.stderr
    assert "per-key concurrency limit -, per-key rate limit 0.5/s" in out.stdout
    out = run("queue", "set", "mail", "--partition-rate-limit", "None")
    assert "per-key" not in out.stdout
    info = queue.update_queue("mail")
    assert (info.partition_concurrency_limit, info.partition_rate_limit) == (None, None)


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("--partition-concurrency-limit", "-1"), 1, "must not be negative"),
        (("--partition-concurrency-limit", "1.5"), 2, "not a whole number"),
        (("--partition-rate-limit", "0"), 1, "greater than 0"),
        (("--partition-rate-limit", "inf"), 2, "not a finite number"),
    ],
)
def test_bad_partition_limits_are_one_line(
    queue: Queue, run, args: tuple[str, ...], status: int, message: str
) -> None:
    queue.enqueue("t", queue="mail")
    out = run("queue", "set", "mail", *args)
    assert out.returncode == status, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    info = queue.update_queue("mail")
    assert (info.partition_concurrency_limit, info.partition_rate_limit) == (None, None)


def test_partitions_are_listed_busiest_first_a_page_at_a_time(queue: Queue, run) -> None:
    for key, jobs in (("small", 1), ("big", 3), ("mid", 2)):
        for _ in range(jobs):
            queue.enqueue("t", queue="work", partition_key=key)
    queue.throttle("work", 600, partition_key="small")
    out = run("queue", "partitions", "work")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["partition", "key", "queued", "running", "throttled", "until"]
    assert [row.split()[:4] for row in rows[:2]] == [["big", "3", "0", "-"], ["mid", "2", "0", "-"]]
    small = rows[2].split()
    assert small[:3] == ["small", "1", "0"]
    assert datetime.fromisoformat(small[3]) > datetime.now(UTC)
    assert len(rows) == 3  # no next page

    first = run("queue", "partitions", "work", "--limit", "2")
    *_, more = first.stdout.splitlines()
    assert more.startswith("next page: --after ")
    page = json.loads(run("queue", "partitions", "work", "--limit", "2", "--json").stdout)
    assert [p["partition_key"] for p in page["partitions"]] == ["big", "mid"]
    assert page["partitions"][0] == {
        "partition_key": "big",
        "queued": 3,
        "running": 0,
        "throttled_until": None,
    }
    assert more == f"next page: --after {shlex.quote(page['next_after'])}"
    rest = json.loads(
        run("queue", "partitions", "work", "--after", page["next_after"], "--json").stdout
    )
    assert [p["partition_key"] for p in rest["partitions"]] == ["small"]


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("nowhere",), 1, "queue 'nowhere' not found"),
        (("work", "--limit", "0"), 2, "--limit"),
        (("work", "--limit", "1001"), 2, "--limit"),
        (("work", "--after", "not a cursor"), 1, "after"),
    ],
)
def test_partitions_mistakes_are_one_line(
    queue: Queue, run, args: tuple[str, ...], status: int, message: str
) -> None:
    queue.enqueue("t", queue="work", partition_key="a")
    out = run("queue", "partitions", *args)
    assert out.returncode == status, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    # One line says what is wrong; before it, at most click's two lines of usage.
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert message in lines[-1] and len(lines) <= 3, out.stderr


def test_enqueue_takes_a_partition_key(queue: Queue, run) -> None:
    out = run("enqueue", "t", "--partition-key", "tenant 7")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["job"]
    assert job["partition_key"] == "tenant 7"
    assert queue.get(job["id"]).partition_key == "tenant 7"
    assert json.loads(run("enqueue", "t").stdout)["job"]["partition_key"] is None
    too_long = run("enqueue", "t", "--partition-key", "k" * 201)
    assert too_long.returncode == 1
    assert "partition_key" in too_long.stderr and "Traceback" not in too_long.stderr
    empty = run("enqueue", "t", "--partition-key", "")
    assert empty.returncode == 1 and "partition_key" in empty.stderr
    assert [s.counts["queued"] for s in queue.stats()] == [2]
