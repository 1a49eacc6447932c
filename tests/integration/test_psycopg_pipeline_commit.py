"""The psycopg behaviour that pgqueue's pipelines work around, kept as a test.

Inside ``with conn.pipeline():``, ``conn.commit()`` after a statement larger than the
socket's buffers can wait forever: psycopg sends a Sync, stops sending once the command
queue is empty even though libpq's output buffer may still hold part of the statement,
and waits for results the server cannot produce before it has the whole statement
(docs/psycopg-pipeline-commit-hang.md). Whether it does depends on how much libpq has
flushed by then, so not every try hangs: 5 of 6 tries did on 2 cores. pgqueue sends its COMMIT as a statement
instead (``pgqueue.queue_base.send_commit``), which the pipeline's exit flushes in full.

If this test fails because the reproduction returned, the installed psycopg has fixed
the behaviour: mark the first test xfail for that version and keep the workaround
until the oldest supported psycopg has the fix too.
"""

from __future__ import annotations

import subprocess
import sys

import psycopg

# Far more than any socket buffer: libpq cannot flush it in the few calls psycopg makes.
SIZE = 64 * 1024 * 1024
WAIT_SECONDS = 15
# Tries of the reproduction before concluding that psycopg no longer hangs.
HANG_TRIES = 4

REPRODUCTION = """
import sys, psycopg
conn = psycopg.connect(sys.argv[1])
with conn.pipeline():
    cur = conn.execute("SELECT length(%s::text)", ("x" * int(sys.argv[2]),))
    {commit}
print(cur.fetchone()[0] if cur.pgresult is not None else "no result", flush=True)
"""


def run(database_url: str, commit: str) -> subprocess.CompletedProcess[str] | None:
    """Run the reproduction; None if it was still waiting after WAIT_SECONDS."""
    code = REPRODUCTION.format(commit=commit)
    try:
        return subprocess.run(
            [sys.executable, "-c", code, database_url, str(SIZE)],
            capture_output=True,
            text=True,
            timeout=WAIT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return None


def test_commit_inside_a_pipeline_after_a_large_statement_can_hang(database_url: str) -> None:
    # Tries until one hangs: a try that returns only means libpq had flushed enough.
    for _ in range(HANG_TRIES):
        if run(database_url, "conn.commit()") is None:
            return
    raise AssertionError(
        f"psycopg {psycopg.__version__} returned {HANG_TRIES} times out of {HANG_TRIES}: "
        "commit() inside a pipeline no longer hangs after a large statement"
    )


def test_commit_sent_as_a_statement_inside_the_pipeline_returns(database_url: str) -> None:
    done = run(database_url, 'conn.execute(b"COMMIT", prepare=False)')
    assert done is not None, "the statement-COMMIT form hung too"
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(SIZE)]


def test_without_a_large_statement_commit_inside_a_pipeline_returns(database_url: str) -> None:
    code = REPRODUCTION.format(commit="conn.commit()")
    done = subprocess.run(
        [sys.executable, "-c", code, database_url, "1000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000"]
