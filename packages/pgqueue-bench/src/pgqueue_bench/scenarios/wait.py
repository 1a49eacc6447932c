"""The wait driver: how soon ``GET /jobs/{id}?wait=S`` answers once its job is final, and
what many waiting requests cost one API process in database connections.

A real ``pgqueue-api`` (one uvicorn worker) on a fresh schema. Jobs are claimed and
acked by the worker's own statements (``WorkerProtocol``) from this process:

- ``--rounds`` single waits, one after another: a request ``?wait=30`` for a running
  job; once the API has recorded the wait (its row in ``job_waiters``), the job is
  acked; the seconds from the ack's commit to the answer, on this process's clock;
- ``--waiters`` requests waiting at once, each for a job of its own: the connections
  the database shows while they all wait (the API's, and this driver's pool of two),
  against those before the waits began, the slowest of
  ten enqueue-and-read pairs sent meanwhile, then one ack of all the jobs and the
  seconds until the first and the last answer.

The requests are plain asyncio streams, one connection each, so that the client in
this process costs far less than the server it measures.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from typing import Any

import click
import psycopg
from psycopg import sql

from pgqueue import Job, JobSpec, Queue, WorkerProtocol
from pgqueue_bench import results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.apiserver import RunningApi, api_server
from pgqueue_bench.options import database_url_option, results_dir_option

WAIT_SECONDS = 30


async def raw_get(base_url: str, path: str) -> tuple[int, Any, float]:
    """GET ``path`` on a connection of its own: status, JSON body, when it was read."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    read_at = time.monotonic()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body), read_at


async def _post(base_url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST ``body`` as JSON to ``path`` on a connection of its own."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, raw = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(raw)


class _Database:
    """What the driver reads of the database: the recorded waits and the connections."""

    def __init__(self, url: str, schema: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        self.waiters = sql.SQL(
            "SELECT count(*) FROM {}.job_waiters WHERE job_id = ANY(%s::bigint[])"
        ).format(sql.Identifier(schema))

    def recorded_waits(self, job_ids: list[int]) -> int:
        """How many of ``job_ids`` the API has recorded as waited for (a wait that ended
        leaves its row a moment longer: only these jobs' rows count)."""
        row = self.conn.execute(self.waiters, (job_ids,)).fetchone()
        return int(row[0]) if row else 0

    def connections(self) -> int:
        """Connections to this database, this one left out."""
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        return int(row[0]) if row else 0

    def until_recorded(self, job_ids: list[int], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.recorded_waits(job_ids) < len(job_ids):
            if time.monotonic() > deadline:
                raise click.ClickException(f"the API recorded fewer than {len(job_ids)} waits")
            time.sleep(0.005)

    def close(self) -> None:
        self.conn.close()


def _claim(queue: Queue, count: int) -> tuple[WorkerProtocol, list[Job]]:
    protocol = WorkerProtocol(queue)
    claimed = protocol.claim(["default"], ["bench"], limit=count)
    if len(claimed) != count:
        raise click.ClickException(f"claimed {len(claimed)} jobs of {count}")
    return protocol, claimed


def _single_waits(api: RunningApi, queue: Queue, db: _Database, rounds: int) -> list[float]:
    """The seconds from an ack's commit to the answer of the request waiting for it."""
    latencies = []
    for n in range(rounds):
        job = queue.enqueue("bench", {"n": n}).job
        protocol, [claimed] = _claim(queue, 1)
        acked_at: list[float] = []

        def ack(
            protocol: WorkerProtocol = protocol,
            claimed: Job = claimed,
            acked_at: list[float] = acked_at,
        ) -> None:
            db.until_recorded([claimed.id])
            protocol.ack(claimed, {"n": claimed.payload["n"]})
            acked_at.append(time.monotonic())

        acker = threading.Thread(target=ack)
        acker.start()
        status, body, read_at = asyncio.run(
            raw_get(api.base_url, f"/jobs/{job.id}?wait={WAIT_SECONDS}")
        )
        acker.join()
        if status != 200 or body["state"] != "succeeded":
            raise click.ClickException(f"a wait answered {status}: {body}")
        latencies.append(read_at - acked_at[0])
    return latencies


def _many_waits(api: RunningApi, queue: Queue, db: _Database, waiters: int) -> dict[str, Any]:
    idle = db.connections()
    jobs = [item.job for item in queue.enqueue_many([JobSpec("bench", {}) for _ in range(waiters)])]
    protocol, claimed = _claim(queue, waiters)
    figures: dict[str, Any] = {"api_connections_idle": idle}

    async def run() -> list[tuple[int, Any, float]]:
        waits = [
            asyncio.create_task(raw_get(api.base_url, f"/jobs/{job.id}?wait={WAIT_SECONDS}"))
            for job in jobs
        ]
        await asyncio.to_thread(db.until_recorded, [job.id for job in jobs])
        figures["api_connections_while_waiting"] = await asyncio.to_thread(db.connections)
        pairs = []
        for _ in range(10):
            asked = time.monotonic()
            status, created = await _post(api.base_url, "/jobs", {"task": "other"})
            shown, _, _ = await raw_get(api.base_url, f"/jobs/{created['id']}")
            if (status, shown) != (201, 200):
                raise click.ClickException(f"a request beside the waits answered {status}")
            pairs.append(time.monotonic() - asked)
        figures["other_request_pair_seconds_median"] = round(statistics.median(pairs), 4)
        figures["other_request_pair_seconds_max"] = round(max(pairs), 4)
        if any(wait.done() for wait in waits):
            raise click.ClickException("a wait answered before its job was final")
        acked = time.monotonic()
        await asyncio.to_thread(protocol.ack_many, [(job, None) for job in claimed])
        figures["ack_seconds"] = round(time.monotonic() - acked, 4)
        answers = await asyncio.gather(*waits)
        figures["first_answer_after_ack_seconds"] = round(min(a[2] for a in answers) - acked, 4)
        figures["last_answer_after_ack_seconds"] = round(max(a[2] for a in answers) - acked, 4)
        return answers

    answers = asyncio.run(run())
    if {(status, body["state"]) for status, body, _ in answers} != {(200, "succeeded")}:
        raise click.ClickException("not every wait answered 200 with its succeeded job")
    figures["api_connections_after"] = db.connections()
    return figures


@click.command("wait")
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    help="Single waits, one after another.",
)
@click.option(
    "--waiters",
    type=click.IntRange(1),
    default=500,
    show_default=True,
    help="Requests waiting at once.",
)
@database_url_option
@results_dir_option
@click.option(
    "--results-name",
    default="wait",
    show_default=True,
    help="The results file is <results dir>/<name>.json.",
)
def wait_command(
    rounds: int,
    waiters: int,
    database_url: str | None,
    results_dir: str | None,
    results_name: str,
) -> None:
    """Time GET /jobs/{id}?wait=S from the ack to the answer, and count what many waits
    cost one API process in database connections."""
    target = database.resolve_target(database_url)
    env = environment.describe(target.url, target.server)
    with (
        database.run_queue(target.url, "bench_wait") as (schema, queue),
        api_server(target.url, schema, workers=1) as api,
    ):
        db = _Database(target.url, schema)
        try:
            latencies = _single_waits(api, queue, db, rounds)
            many = _many_waits(api, queue, db, waiters)
        finally:
            db.close()
    ordered = sorted(latencies)
    single = {
        "rounds": rounds,
        "ms_median": round(statistics.median(ordered) * 1000, 2),
        "ms_p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 2),
        "ms_max": round(ordered[-1] * 1000, 2),
    }
    click.echo(
        f"ack to answer, {rounds} waits: median {single['ms_median']} ms, "
        f"p95 {single['ms_p95']} ms, max {single['ms_max']} ms"
    )
    click.echo(
        f"{waiters} waiting at once: {many['api_connections_while_waiting']} connections "
        f"(idle API: {many['api_connections_idle']}); last answer "
        f"{many['last_answer_after_ack_seconds']} s after the ack; other requests at most "
        f"{many['other_request_pair_seconds_max']} s"
    )
    results.record(
        results_name,
        env,
        parameters={"rounds": rounds, "waiters": waiters, "wait_seconds": WAIT_SECONDS},
        directory=results_dir,
        runs=[{"single_waits_seconds": [round(x, 5) for x in latencies], "many": many}],
        summary={"single_wait": single, "many_waits": many},
    )
