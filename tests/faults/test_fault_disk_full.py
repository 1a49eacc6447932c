"""Scenario 5: the disk under the jobs table fills up.

The queue's database lives in a tablespace on a small tmpfs (the write-ahead log stays
on the cluster's own disk, as it usually has a volume of its own); a ballast file then
takes every free byte. Enqueues get a clear 503 and write nothing, not even part of a
batch; workers keep their outcomes and back off; once space returns, everything
resumes and nothing acknowledged is lost.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import time
from pathlib import Path

import fault_sql
import httpx
import pytest
from fault_support import SCHEMA, FaultRun, prepare_schema, send_via_api, serve_api, work_jobs
from polling import wait_for

from pgqueue import DatabaseUnavailable
from pgqueue_api import ApiSettings
from pgqueue_bench.infra.disks import fill_disk, small_filesystem

TMPFS_MB = 64
DISK_FULL_SECONDS = 2.0
PAD = os.urandom(400).hex()


def _mounted_tmpfs(stack: contextlib.ExitStack) -> Path:
    try:
        return stack.enter_context(small_filesystem(TMPFS_MB))
    except subprocess.CalledProcessError as exc:
        reason = (exc.stderr or b"").decode(errors="replace").strip() or f"exit {exc.returncode}"
        pytest.skip(f"cannot mount a {TMPFS_MB} MiB tmpfs for the data (needs root): {reason}")


def test_a_full_disk_refuses_enqueues_cleanly_and_everything_resumes_when_space_returns(
    start_server, record_figures, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        mount = _mounted_tmpfs(stack)
        server = start_server()
        stack.callback(server.destroy)  # before the tmpfs goes
        location = mount / "tablespace"
        location.mkdir()
        if server.binaries.os_user:
            owner = pwd.getpwnam(server.binaries.os_user)
            os.chown(location, owner.pw_uid, owner.pw_gid)
        fault_sql.run(
            server.url(),
            "tablespace_create",
            tablespace="small",
            location=fault_sql.sql.Literal(str(location)),
        )
        fault_sql.run(
            server.url(), "database_create_in_tablespace", database="queue", tablespace="small"
        )
        url = server.url("queue")
        prepare_schema(url)

        settings = ApiSettings(database_url=url, schema=SCHEMA, pool_timeout=2.0)
        with FaultRun(url, tmp_path) as run, serve_api(settings) as api:
            workers = run.start_workers(2)
            # Incompressible padding, so the table needs new pages at a steady pace.
            producer = run.produce(
                20_000, send=send_via_api(api), batch=20, pause=0.01, ms=[1, 5], pad=PAD
            )
            run.wait_until_succeeded(100)

            ballast = fill_disk(mount)
            wait_for(lambda: producer.refusals, what="an enqueue refused for want of space")
            # A batch is all or nothing: send batches until one is refused, and look for
            # any of its jobs. Through the library first (which says why), then HTTP.
            attempt = iter(range(10_000))

            def fresh_keys(count: int) -> list[str]:
                return [f"full-{next(attempt)}" for _ in range(count)]

            def refused_in_process() -> tuple[str, list[str]] | None:
                specs = work_jobs(50, f"full-{next(attempt)}", pad=PAD)
                try:
                    run.enqueue(specs)  # it still fitted: an acknowledged enqueue
                except DatabaseUnavailable as exc:
                    return str(exc), [spec.idempotency_key for spec in specs]
                return None

            def refused_over_http() -> tuple[httpx.Response, list[str]] | None:
                keys = fresh_keys(50)
                jobs = [
                    {"task": "fault_work", "payload": {"pad": PAD}, "idempotency_key": k}
                    for k in keys
                ]
                response = api.post("/jobs/batch", json={"jobs": jobs})
                if response.status_code == 201:  # it still fitted: an acknowledged enqueue
                    items = response.json()["items"]
                    run.acknowledge(
                        {k: item["job"]["id"] for k, item in zip(keys, items, strict=True)}
                    )
                    return None
                return response, keys

            error, library_keys = wait_for(refused_in_process, what="a refused enqueue_many")
            refused, http_keys = wait_for(refused_over_http, what="a refused POST /jobs/batch")
            half_written = fault_sql.run(
                url, "jobs_with_keys", {"keys": library_keys + http_keys}, schema=SCHEMA
            )
            time.sleep(DISK_FULL_SECONDS)  # how long the fault lasts, not a wait for anything
            ballast.unlink()
            freed_at = run.now()
            acknowledged = len(producer.acknowledged)
            wait_for(
                lambda: len(producer.acknowledged) > acknowledged + 100,
                what="enqueues to be acknowledged again",
            )
            producer.stop()

            run.wait_until_done(timeout=240)
            verdict = run.verdict()
            logs = workers.logs()

    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert refused.json()["detail"] == "database unavailable; retry later"
    assert half_written == [{"found": 0}]
    # A library caller is told why; the API's 503 keeps the reason for its own log.
    assert error.startswith("database unavailable: could not extend file")
    assert "No space left on device" in error
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": verdict.jobs}
    record_figures(
        "05-disk-full",
        verdict.figures(
            recovery_seconds=verdict.recovery_seconds(freed_at),
            api_refusals=len(producer.refusals),
            workers_saw_disk_full="No space left on device" in logs,
        ),
    )
