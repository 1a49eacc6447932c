"""Completion in the handler's transaction behind PgBouncer in transaction pooling mode,
with ``--no-prepare``: the handler's write and its job's completion are one server
transaction whichever connection PgBouncer gives it (``job.transaction()``,
``job.atransaction()``, or a connection of the handler's own), the worker's check of
the completion runs on another, and a lease lost fails that transaction there too."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psycopg
from polling import wait_for
from processes import environment, start_worker, stop

from pgqueue import Queue

WORKER_TESTS = Path(__file__).resolve().parent.parent / "worker"
JOBS = 30


def test_handlers_complete_in_one_server_transaction_through_pgbouncer(
    bouncer, schema, database_url, tmp_path
):
    table = f"{schema}.app_rows"
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (job_id bigint, attempt int, pid int)")
    queue = Queue.connect(bouncer.url, schema=schema, max_size=2, prepare=False)
    log_path = tmp_path / "worker.log"
    hold = str(tmp_path / "cancelled")
    tasks = ["in_transaction", "own_connection", "in_async_transaction"]
    worker = None
    try:
        payload = {"table": table, "url": bouncer.url}
        jobs = [queue.enqueue(tasks[n % 3], payload).job for n in range(JOBS)]
        doomed = queue.enqueue("in_transaction", {**payload, "hold": hold}).job
        worker = start_worker(
            [
                "--database-url",
                bouncer.url,
                "--schema",
                schema,
                "--no-plugin-autoload",
                "--handlers",
                "effects_handlers:HANDLERS",
                "--no-listen",
                "--no-prepare",
                "--concurrency",
                "4",
                "--poll-interval",
                "0.1",
            ],
            environment(WORKER_TESTS),
            log_path,
        )
        wait_for(lambda: Path(f"{hold}.held").exists(), what="the held attempt's row")
        queue.cancel(doomed.id)
        Path(f"{hold}.go").touch()
        wait_for(lambda: Path(f"{hold}.lost").exists(), what="LeaseLost behind PgBouncer")

        def states() -> Counter[str]:
            return Counter(queue.get(job.id).state.value for job in jobs)

        wait_for(
            lambda: states() == {"succeeded": JOBS},
            what=f"every job to succeed; worker log:\n{log_path.read_text()}",
            interval=0.2,
        )
    finally:
        exit_codes = stop([worker]) if worker is not None else [0]
        queue.close()
    log = log_path.read_text()
    assert exit_codes == [0], log
    assert "prepared statement" not in log and "database unavailable" not in log, log
    assert queue_state(database_url, schema, doomed.id) == "cancelled"
    with psycopg.connect(database_url) as db:
        rows = db.execute(f"SELECT job_id, attempt FROM {table} ORDER BY 1").fetchall()
        assert rows == [(job.id, 1) for job in jobs]
        # Each row and its job's completion were written by one server transaction.
        same = db.execute(
            f"SELECT count(*) FROM {table} AS app JOIN {schema}.finished_jobs AS job"
            " ON job.id = app.job_id AND job.xmin = app.xmin"
        ).fetchone()
        assert same == (JOBS,)
    assert "prepared statement" not in bouncer.log()


def queue_state(database_url: str, schema: str, job_id: int) -> str:
    with psycopg.connect(database_url) as db:
        row = db.execute(f"SELECT state::text FROM {schema}.jobs WHERE id = %s", (job_id,))
        return row.fetchone()[0]  # type: ignore[index]
