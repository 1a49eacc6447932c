"""Scenario 9: hostile data.

Job ids past 2^31; attempt counts at the integer limit, which must neither overflow the
backoff nor wedge the claim; payloads a handler cannot decode, and one Python itself
cannot (JSON nested deeper than its recursion limit, which PostgreSQL stores happily);
two lives of a worker with the same id; notifications that carry the queue's name and
never a payload. The odd rows are written around pgqueue's validation, as another
client or a hand-made fix would write them. Each must end with a clear outcome while
every other job in the queue runs as usual.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import fault_sql
import psycopg
import pytest
from fault_support import SCHEMA, FaultRun, prepare_schema, send_via_api, serve_api, work_jobs
from hostile_json import TOO_DEEP_ARRAYS as TOO_DEEP

from pgqueue import JobSpec, JobState, Lease, LeaseLost, Queue, Waiter, WorkerProtocol
from pgqueue.claiming import default_worker_id
from pgqueue_api import ApiSettings
from pgqueue_bench.verdict import audit

INT_MAX = 2**31 - 1


def _raw_job(url: str, task: str, payload: str, *, attempts: int = 0, max_attempts: int = 3):
    rows = fault_sql.run(
        url,
        "job_insert_raw",
        {"task": task, "payload": payload, "attempts": attempts, "max_attempts": max_attempts},
        schema=SCHEMA,
    )
    return rows[0]["id"]


def _wedged(logs: str) -> list[str]:
    """Lines saying a worker's claim loop or reaper failed outright."""
    return [
        line for line in logs.splitlines() if "claim loop error" in line or "reaper failed" in line
    ]


def test_job_ids_past_2_to_the_31_run_through_workers_heartbeats_and_the_api(
    server_database: str, record_figures, tmp_path: Path
) -> None:
    url = server_database
    prepare_schema(url)
    fault_sql.run(url, "jobs_restart_ids", schema=SCHEMA)
    settings = ApiSettings(database_url=url, schema=SCHEMA)
    with FaultRun(url, tmp_path) as run, serve_api(settings) as api:
        run.start_workers(1)
        # Jobs that outlive their lease: heartbeats extend them by id.
        run.enqueue(work_jobs(4, "long", ms=3000))
        run.produce(60, send=send_via_api(api), batch=10)
        later = api.post(
            "/jobs", json={"task": "fault_work", "payload": {}, "delay_seconds": 3600}
        ).json()
        run.acknowledge({"later": later["id"]})
        cancelled = api.post(f"/jobs/{later['id']}/cancel")
        retried = api.post(f"/jobs/{later['id']}/retry")
        run.wait_until_done(timeout=60)
        fetched = api.get(f"/jobs/{later['id']}").json()
        verdict = run.verdict()
        ids = [job_id for job_id in run.acknowledged().values()]

    assert min(ids) >= 3_000_000_000
    assert (cancelled.json()["state"], retried.json()["state"]) == ("cancelled", "queued")
    assert fetched["state"] == "succeeded"
    assert verdict.broken_promises() == {}
    assert verdict.redeliveries == 0
    assert verdict.states == {"succeeded": 65}
    record_figures("09-ids-past-2-31", verdict.figures(smallest_id=min(ids)))


def test_attempt_counts_at_the_integer_limit_back_off_capped_and_wedge_nothing(
    server_database: str, record_figures, tmp_path: Path
) -> None:
    url = server_database
    prepare_schema(url)
    # Two attempts left, each failing: the backoff after attempt 2^31-2 must be capped.
    failing = _raw_job(
        url, "fault_work", json.dumps({"fail_rate": 1}), attempts=INT_MAX - 2, max_attempts=INT_MAX
    )
    # A worker vanished holding attempt 2^31-3: the reaper's backoff must be capped too,
    # and the two attempts left fail.
    reaped = fault_sql.run(
        url,
        "job_insert_raw_expired",
        {
            "task": "fault_work",
            "payload": json.dumps({"fail_rate": 1}),
            "attempts": INT_MAX - 2,
            "max_attempts": INT_MAX,
        },
        schema=SCHEMA,
    )[0]["id"]
    # No attempt left to count: before the claim saturated, this row made every claim of
    # its queue fail with "integer out of range".
    saturated = _raw_job(url, "fault_work", json.dumps({}), attempts=INT_MAX, max_attempts=INT_MAX)
    with FaultRun(url, tmp_path) as run:
        workers = run.start_workers(1, retry_cap=0.5)
        run.produce(40)
        run.wait_until_done(timeout=60)
        jobs = {job_id: run.queue.get(job_id) for job_id in (failing, reaped, saturated)}
        transitions = audit.transitions(url, SCHEMA)
        logs = workers.logs()
        verdict = run.verdict(expect=(JobState.SUCCEEDED,))

    assert (jobs[failing].state, jobs[failing].attempts) == (JobState.DEAD, INT_MAX)
    assert "failed on purpose" in jobs[failing].last_error
    assert (jobs[reaped].state, jobs[reaped].attempts) == (JobState.DEAD, INT_MAX)
    assert (jobs[saturated].state, jobs[saturated].attempts) == (JobState.SUCCEEDED, INT_MAX)
    retries = [
        row
        for row in transitions
        if row["job_id"] in (failing, reaped) and row["to_state"] == "queued"
    ]
    # Retries after attempts 2^31-3 (by the reaper) and 2^31-2 (by the worker), each
    # delayed by at most the 0.5 s cap, measured on the database clock.
    assert sorted(row["job_id"] for row in retries) == sorted([failing, reaped, reaped])
    assert any(row["job_id"] == reaped and row["attempts"] == INT_MAX - 2 for row in retries)
    assert all((row["run_at"] - row["at"]).total_seconds() <= 0.5 for row in retries)
    assert _wedged(logs) == []
    assert verdict.broken_promises(also_enqueued=[failing, reaped, saturated]) == {}
    assert verdict.states == {"succeeded": 41, "dead": 2}
    record_figures(
        "09-attempts-at-integer-limit",
        verdict.figures(
            longest_retry_delay_seconds=max(
                round((row["run_at"] - row["at"]).total_seconds(), 3) for row in retries
            )
        ),
    )


def test_payloads_nobody_can_decode_end_dead_with_clear_errors_and_harm_no_other_job(
    server_database: str, record_figures, tmp_path: Path
) -> None:
    url = server_database
    prepare_schema(url)
    hostile = {
        "not base64": (json.dumps({"image": "%%% not base64 %%%"}), "Error"),
        "wrong type": (json.dumps({"image": 42}), "payload.image must be a base64 string"),
        "not an object": (json.dumps([1, 2, 3]), "AttributeError"),
        "too deep": (
            json.dumps({"image": "x", "extra": None})[:-1] + f', "deep": {TOO_DEEP}}}',
            "",
        ),
    }
    ids = {name: _raw_job(url, "fault_decode", payload) for name, (payload, _) in hostile.items()}
    # A job with a payload Python cannot load whose worker vanished: the reaper must put
    # it back rather than fail on it forever (and reap nothing else in the meantime).
    vanished = fault_sql.run(
        url,
        "job_insert_raw_expired",
        {"task": "fault_decode", "payload": TOO_DEEP, "attempts": 1, "max_attempts": 3},
        schema=SCHEMA,
    )[0]["id"]
    image = base64.b64encode(b"\x89PNG fake image").decode()
    settings = ApiSettings(database_url=url, schema=SCHEMA)
    with FaultRun(url, tmp_path) as run, serve_api(settings) as api:
        decodable = run.enqueue(
            [
                JobSpec("fault_decode", {"image": image}, idempotency_key=f"image-{n}")
                for n in range(10)
            ]
        )
        workers = run.start_workers(2)
        run.produce(60)
        run.wait_until_done(timeout=60)
        jobs = {name: run.queue.get(job_id) for name, job_id in ids.items()}
        reaped = run.queue.get(vanished)
        shown = api.get(f"/jobs/{ids['too deep']}")
        listed = api.get("/jobs", params={"state": "dead"})
        logs = workers.logs()
        verdict = run.verdict()
        decoded = [run.queue.get(job_id).result for job_id in decodable]

    for name, (_, error) in hostile.items():
        assert jobs[name].state is JobState.DEAD, (name, jobs[name])
        assert jobs[name].attempts == 3
        assert error in jobs[name].last_error, (name, jobs[name].last_error)
    assert jobs["too deep"].last_error == (
        "payload could not be decoded: JSON nested more deeply than Python can decode"
    )
    assert (reaped.state, reaped.attempts) == (JobState.DEAD, 3)
    assert reaped.last_error.startswith("payload could not be decoded")
    assert shown.status_code == 200 and isinstance(shown.json()["payload"], str)
    assert listed.status_code == 200 and len(listed.json()["jobs"]) == 5
    assert decoded == [{"bytes": 15}] * 10
    assert _wedged(logs) == []
    assert verdict.broken_promises(also_enqueued=[*ids.values(), vanished]) == {}
    assert verdict.states == {"succeeded": 70, "dead": 5}
    record_figures(
        "09-undecodable-payloads",
        verdict.figures(jobs=verdict.jobs + len(hostile) + 1, hostile_jobs_dead=len(hostile) + 1),
    )


# Each kind of row Python cannot load as PostgreSQL stores and prints it, with the reason
# its failed attempts must give. PostgreSQL itself refuses the other kinds a client could
# send (NaN, Infinity, a lone UTF-16 surrogate) in jsonb: tests/integration shows it.
POISON = {
    # Printed as 5,001 digits: past the 4,300 Python converts to an int.
    "huge integer": ('{"n": 1e5000}', "a number with more than 4300 digits"),
    "too deep": (f'{{"deep": {TOO_DEEP}}}', "JSON nested more deeply than Python can decode"),
    # A float past its range, which Python would read as Infinity.
    "past float range": ('{"x": 1' + "0" * 400 + ".5}", "a number too large for a float"),
    # Python loads it, but pgqueue never stores one (nor could the API write it back).
    "deeper than pgqueue stores": (
        f'{{"deep": {"[" * 300 + "]" * 300}}}',
        "JSON nested more than 200 levels deep",
    ),
}


def _vanished_job(url: str, payload: str) -> int:
    """A running job whose worker vanished on its first attempt: its lease expired."""
    return fault_sql.run(
        url,
        "job_insert_raw_expired",
        {"task": "fault_work", "payload": payload, "attempts": 1, "max_attempts": 3},
        schema=SCHEMA,
    )[0]["id"]


def test_poison_rows_under_a_worker_fleet_fail_only_themselves(
    server_database: str, record_figures, tmp_path: Path
) -> None:
    """Rows of every kind Python cannot load, queued before and during the run and held
    by workers that vanished, among a producer's jobs for three worker processes. Each
    poison job fails its three attempts with its reason and ends dead; every other job
    succeeds once; the reaper goes on reaping (a normal job whose worker vanished, with
    an error history Python cannot load, is put back and succeeds)."""
    url = server_database
    prepare_schema(url)
    poison: dict[str, int] = {}
    for kind, (payload, _) in POISON.items():
        poison[f"{kind}, queued"] = _raw_job(url, "fault_work", payload)
        poison[f"{kind}, vanished"] = _vanished_job(url, payload)
    rerun = _vanished_job(url, json.dumps({"ms": 10}))
    fault_sql.run(
        url, "job_errors_raw", {"id": rerun, "errors": '[{"attempt": 1e5000}]'}, schema=SCHEMA
    )
    vanished = [poison[f"{kind}, vanished"] for kind in POISON] + [rerun]
    with FaultRun(url, tmp_path) as run:
        workers = run.start_workers(3)
        run.produce(300, batch=10)
        run.wait_until_succeeded(100)
        # More, mixed in with the producer's jobs while every worker is busy.
        for kind, (payload, _) in POISON.items():
            poison[f"{kind}, mid-run"] = _raw_job(url, "fault_work", payload)
        run.wait_until_done(timeout=120)
        jobs = {name: run.queue.get(job_id) for name, job_id in poison.items()}
        rerun_job = run.queue.get(rerun)
        stuck = run.queue.list(state="queued").jobs + run.queue.list(state="running").jobs
        transitions = audit.transitions(url, SCHEMA)
        logs = workers.logs()
        verdict = run.verdict()

    for name, job in jobs.items():
        reason = POISON[name.split(",")[0]][1]
        assert (job.state, job.attempts) == (JobState.DEAD, 3), (name, job)
        assert job.last_error.startswith(f"payload could not be decoded: {reason}"), name
        assert all(
            entry["error"].startswith("payload could not be decoded") for entry in job.errors
        )
    # The reaper took back every expired lease: each vanished job's first attempt ended
    # in the trail (failed, at attempt 1) before a worker of the fleet claimed it again.
    reaped = {
        row["job_id"]
        for row in transitions
        if row["job_id"] in vanished
        and (row["from_state"], row["to_state"], row["attempts"]) == ("running", "queued", 1)
    }
    assert reaped == set(vanished)
    assert rerun_job.state is JobState.SUCCEEDED
    assert _wedged(logs) == [] and "Traceback" not in logs
    assert stuck == []
    assert verdict.broken_promises(also_enqueued=[*poison.values(), rerun]) == {}
    assert verdict.lost == [] and verdict.duplicates == 0
    assert verdict.states == {"succeeded": 301, "dead": len(poison)}
    record_figures(
        "09-poison-rows-under-a-fleet",
        verdict.figures(
            workers=3,
            stuck=len(stuck),
            poison_jobs=len(poison),
            poison_dead=sum(job.state is JobState.DEAD for job in jobs.values()),
            vanished_reaped=len(reaped),
        ),
    )


def test_two_lives_of_a_worker_with_the_same_id_are_kept_apart_by_their_lease_tokens(
    server_database: str,
) -> None:
    url = server_database
    prepare_schema(url)
    # In a container every worker may be pid 1 on the same host name.
    same_id = "worker-7f9c:1:0"
    with Queue.connect(url, schema=SCHEMA) as queue:
        protocol = WorkerProtocol(queue)
        queue.enqueue_many(work_jobs(1, "life"))
        [first] = protocol.claim(
            ["default"], ["fault_work"], 1, lease_seconds=60, worker_id=same_id
        )
        fault_sql.run(url, "job_expire_lease", {"ids": [first.id]}, schema=SCHEMA)
        assert [job.id for job in protocol.reap()] == [first.id]
        queue.pool.check()
        wait_runnable(queue)
        [second] = protocol.claim(
            ["default"], ["fault_work"], 1, lease_seconds=60, worker_id=same_id
        )

        assert (second.id, second.worker_id) == (first.id, first.worker_id)
        assert second.lease_token != first.lease_token
        assert protocol.heartbeat([Lease(first.id, first.lease_token)]) == {first.id}
        with pytest.raises(LeaseLost):
            protocol.ack(first, {"life": 1})
        with pytest.raises(LeaseLost):
            protocol.fail(first, "the first life's failure")
        done = protocol.ack(second, {"life": 2})

    assert (done.state, done.attempts, done.result) == (JobState.SUCCEEDED, 2, {"life": 2})
    # Left to itself, pgqueue never hands out the same id twice: host:pid plus a nonce.
    assert len({default_worker_id() for _ in range(100)}) == 100


def wait_runnable(queue: Queue) -> None:
    """Wait out the reaped job's retry backoff (one second at most by default)."""
    protocol = WorkerProtocol(queue)
    deadline = time.monotonic() + 30
    while (protocol.next_run_in(["default"], ["fault_work"]) or 0) > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_notification_carries_the_queue_name_and_never_the_payload(
    server_database: str,
) -> None:
    url = server_database
    prepare_schema(url)
    secret = "s3cret:" + "x" * 900_000  # near the 1 MiB payload limit; NOTIFY takes 8000 bytes
    with (
        psycopg.connect(url, autocommit=True) as listener,
        Queue.connect(url, schema=SCHEMA) as queue,
    ):
        protocol = WorkerProtocol(queue)
        protocol.listen(listener)
        # A worker waits on both queues: its claim for a task nobody enqueues came back empty.
        protocol.claim(["default", "other"], ["nothing"], waiter=Waiter("w/0", 60.0))
        queue.enqueue("fault_work", {"blob": secret})
        queue.enqueue_many(work_jobs(500, "bulk"))
        queue.enqueue("fault_work", {"blob": secret}, queue="other")
        notes = []
        deadline = time.monotonic() + 30
        while len(notes) < 3 and time.monotonic() < deadline:
            notes.extend(listener.notifies(timeout=1, stop_after=3 - len(notes)))

    assert [note.payload for note in notes] == ["default", "default", "other"]
    assert {note.channel for note in notes} == {f"{SCHEMA}_jobs"}
