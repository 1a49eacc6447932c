"""The smallest FastAPI enqueue service a team would write by hand: the reference that
``pgqueue bench api`` runs beside ``pgqueue-api``, under the same uvicorn worker count
and the same load.

One pydantic body model (``task``, ``payload``, ``queue``), an asyncio psycopg pool of 8
autocommit connections, one prepared ``INSERT ... RETURNING`` into a plain table with
one partial index on queued jobs, and the row back as a ``JSONResponse`` with 201; its
batch route is one multi-row ``INSERT ... RETURNING id``. No authentication, no body
limit, no strict JSON, no idempotency keys, no metrics: what pgqueue-api costs beyond
this is what its features cost.

Served by uvicorn from its environment:

    MINIMAL_API_DATABASE_URL=postgresql://... MINIMAL_API_SCHEMA=bench_minimal \\
        uvicorn pgqueue_bench.scenarios.api.minimal_api:app --workers 2
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

ENV_DATABASE_URL = "MINIMAL_API_DATABASE_URL"
ENV_SCHEMA = "MINIMAL_API_SCHEMA"
POOL_SIZE = 8

TABLE = """
CREATE TABLE {schema}.jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    task text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{{}}',
    state text NOT NULL DEFAULT 'queued',
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON {schema}.jobs (queue, id) WHERE state = 'queued';
"""


def create_schema(url: str, schema: str) -> None:
    """The schema ``schema`` with the app's one table in it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(TABLE).format(schema=sql.Identifier(schema)))


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and its table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class JobIn(BaseModel):
    """A job to enqueue."""

    task: str
    payload: dict[str, Any] = Field(default_factory=dict)
    queue: str = "default"


class BatchIn(BaseModel):
    """Jobs to enqueue together."""

    jobs: list[JobIn]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    schema = os.environ[ENV_SCHEMA]
    pool = AsyncConnectionPool(
        os.environ[ENV_DATABASE_URL],
        min_size=POOL_SIZE,
        max_size=POOL_SIZE,
        # The table's schema first on the path, set once per connection.
        kwargs={"autocommit": True, "options": f"-c search_path={schema}"},
        open=False,
    )
    await pool.open(wait=True)
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


app = FastAPI(lifespan=lifespan)

INSERT_ONE = (
    "INSERT INTO jobs (queue, task, payload) VALUES (%s, %s, %s) RETURNING id, state, enqueued_at"
)


def _insert_many(rows: int) -> sql.Composed:
    values = sql.SQL(", ").join([sql.SQL("(%s, %s, %s)")] * rows)
    return sql.SQL("INSERT INTO jobs (queue, task, payload) VALUES {} RETURNING id").format(values)


@app.post("/jobs", status_code=201)
async def enqueue(job: JobIn) -> JSONResponse:
    """Insert one job; its id, state and enqueue time."""
    async with app.state.pool.connection() as conn:
        cursor = await conn.execute(
            INSERT_ONE, (job.queue, job.task, Jsonb(job.payload)), prepare=True
        )
        job_id, state, enqueued_at = await cursor.fetchone()
    return JSONResponse(
        {"id": job_id, "state": state, "enqueued_at": enqueued_at.isoformat()}, status_code=201
    )


@app.post("/jobs/batch", status_code=201)
async def enqueue_batch(batch: BatchIn) -> JSONResponse:
    """Insert the jobs in one statement; their ids."""
    params: list[Any] = []
    for job in batch.jobs:
        params += (job.queue, job.task, Jsonb(job.payload))
    async with app.state.pool.connection() as conn:
        cursor = await conn.execute(_insert_many(len(batch.jobs)), params, prepare=True)
        ids = [row[0] for row in await cursor.fetchall()]
    return JSONResponse({"ids": ids}, status_code=201)


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    """200 once the pool is open: what the benchmark waits for before loading it."""
    return {"status": "ok"}
