"""`pgqueue dev`: the embedded PostgreSQL, the API and a worker, started as a user would."""

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psycopg
from polling import wait_for
from psycopg import sql

from pgqueue import embedded

PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dev_runs_a_job_end_to_end_and_stops_cleanly_on_ctrl_c():
    # The embedded server the suite already uses; a schema of this test's own in it.
    embedded.start()
    schema = f"dev_{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**os.environ, "PGQUEUE_SCHEMA": schema}
    proc = subprocess.Popen(
        [PGQUEUE, "dev", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: httpx.get(f"{base}/healthz").status_code == 200,
            what="the API to answer",
            interval=0.2,
            ignoring=(httpx.HTTPError,),
        )
        created = httpx.post(f"{base}/jobs", json={"task": "echo", "payload": {"hi": 1}})
        assert created.status_code == 201
        job_id = created.json()["id"]
        done = wait_for(
            lambda: (j := httpx.get(f"{base}/jobs/{job_id}").json())["state"] == "succeeded" and j,
            what="the job to succeed",
            interval=0.2,
            ignoring=(httpx.HTTPError,),
        )
        assert done["result"] == {"hi": 1}
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        with psycopg.connect(embedded.running_url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    assert proc.returncode == 0, output
    assert f"curl -s -X POST {base}/jobs" in output
    assert "api    | " in output and "worker | " in output
    assert "stopped; the embedded PostgreSQL is still running" in output
    assert embedded.running_url() is not None


def test_dev_says_when_the_port_is_taken():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [PGQUEUE, "dev", "--port", str(port)], capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is taken: pass --port" in result.stderr
    assert "Traceback" not in result.stderr
