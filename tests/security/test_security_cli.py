"""Hostile input through ``pgqueue enqueue``: markup, very long names, NUL, text that is
not UTF-8, odd JSON and numbers out of range each end in one ``Error:`` line and exit
status 1 (refused) or 2 (usage), never a traceback, and enqueue nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue import Queue

PGQUEUE = Path(sys.executable).parent / "pgqueue"
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
DEEP = '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}"

# Arguments after `pgqueue enqueue`. A NUL cannot be an argument at all (the operating
# system ends each argument at its first NUL), so NUL comes in as the JSON escape.
# Bytes are arguments that are not UTF-8, as a shell passes them.
HOSTILE: dict[str, list[str | bytes]] = {
    "markup task": [SCRIPT],
    "markup task 2": [IMG],
    "markup queue": ["echo", "--queue", SCRIPT],
    "markup queue 2": ["echo", "--queue", IMG],
    "newline in task": ["echo\nrm"],
    "bidi override in task": ["echo\u202egnp.exe"],
    "zero-width in queue": ["echo", "--queue", "de\u200bfault"],
    "long task": ["t" * 5_000],
    "long queue": ["echo", "--queue", "q" * 5_000],
    "long idempotency key": ["echo", "--idempotency-key", "k" * 100_000],
    "long unique key": ["echo", "--unique-key", "k" * 100_000],
    "NUL in payload value": ["echo", "--payload", '{"a": "\\u0000"}'],
    "NUL in payload key": ["echo", "--payload", '{"\\u0000": 1}'],
    "lone surrogate escape in payload": ["echo", "--payload", '{"a": "\\ud800"}'],
    "payload not JSON": ["echo", "--payload", "{nope"],
    "payload not an object": ["echo", "--payload", "[1]"],
    "payload NaN": ["echo", "--payload", '{"a": NaN}'],
    "payload nested too deep": ["echo", "--payload", DEEP],
    "task not UTF-8": [b"\xff\xfe"],
    "queue not UTF-8": ["echo", "--queue", b"\xff"],
    "payload not UTF-8": ["echo", "--payload", b'{"a": "\xff"}'],
    "payload key not UTF-8": ["echo", "--payload", b'{"\xc3": 1}'],
    "idempotency key not UTF-8": ["echo", "--idempotency-key", b"\xff"],
    "unique key as CESU-8 surrogate": ["echo", "--unique-key", b"\xed\xa0\x80"],
    "priority out of range": ["echo", "--priority", "99999999999999999999"],
    "max attempts out of range": ["echo", "--max-attempts", "99999999999999999999"],
    "delay NaN": ["echo", "--delay", "nan"],
    "delay infinite": ["echo", "--delay", "inf"],
    "timeout negative": ["echo", "--timeout", "-1"],
}


@pytest.mark.parametrize("args", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_enqueue_is_one_error_line_not_a_traceback(
    database_url: str, schema: str, queue: Queue, args: list[str | bytes]
):
    command: list[str | bytes] = [str(PGQUEUE), "enqueue", *args]
    command += ["--database-url", database_url, "--schema", schema]
    done = subprocess.run(command, capture_output=True, timeout=120)
    stderr = done.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    assert done.returncode in (1, 2), (done.returncode, stderr[-2000:])
    assert done.stdout == b""
    lines = [line for line in stderr.splitlines() if line.strip()]
    # One Error: line (a usage error adds click's two lines of usage before it).
    assert [line for line in lines if line.startswith("Error:")] == [lines[-1]], stderr
    assert len(lines) <= 3, stderr
    assert len(lines[-1]) <= 500, lines[-1][:600]  # the value is not echoed in full
    assert queue.stats() == []  # nothing was enqueued
