"""The FastAPI application, built by a factory from :class:`ApiSettings`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any, TypedDict

import anyio.to_thread
from fastapi import Depends, FastAPI, params

from pgqueue import AsyncProducer, Queue
from pgqueue.gc_tuning import tune_garbage_collector
from pgqueue_api.auth import BEARER_SCHEME, BearerAuthMiddleware
from pgqueue_api.body_limit import BodyLimitMiddleware
from pgqueue_api.docs import ASSETS_PATH, install_docs
from pgqueue_api.errors import install_error_handlers
from pgqueue_api.logs import RequestIdMiddleware
from pgqueue_api.metrics import metrics_registry
from pgqueue_api.responses import (
    ErrorResponse,
)
from pgqueue_api.routes_jobs import router as jobs_router
from pgqueue_api.routes_ops import health_router, metrics_router, queues_router
from pgqueue_api.routes_queues import router as queue_control_router
from pgqueue_api.routes_schedules import router as schedules_router
from pgqueue_api.routes_workers import router as workers_router
from pgqueue_api.settings import ApiSettings
from pgqueue_api.single_enqueue import SingleEnqueueMiddleware

log = logging.getLogger("pgqueue.api")

DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/openapi.json")

DESCRIPTION = """\
Enqueue, inspect, cancel and retry the jobs of a pgqueue queue, a durable at-least-once
job queue on PostgreSQL. Workers run the jobs.

Errors are JSON: `{"detail": "...", "errors": [{"field": "...", "message": "..."}]}`.
A 503 carries `Retry-After`.
"""


class RouterOptions(TypedDict, total=False):
    """What ``FastAPI.include_router`` is given for the routers behind the token."""

    dependencies: Sequence[params.Depends]
    responses: dict[int | str, dict[str, Any]]


def create_app(settings: ApiSettings, *, queue: Queue | None = None) -> FastAPI:
    """The API for ``settings``.

    By default the app opens its own :class:`~pgqueue.Queue` (a connection pool) when it
    starts and closes it when it stops. Pass ``queue`` to serve one you manage instead,
    for example to embed the API in a process that already has one. Either way it opens
    an :class:`~pgqueue.AsyncProducer` beside the Queue, with up to
    ``settings.enqueue_pool_size`` connections, for ``POST /jobs``.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned: Queue | None = None
        if queue is None:
            # Opening does not wait for the database: while it is down the API starts
            # anyway and answers 503, and /healthz says so.
            owned = Queue.connect(
                settings.database_url,
                schema=settings.schema,
                min_size=1,
                max_size=settings.queue_pool_size,
                pool_timeout=settings.pool_timeout,
                prepare=settings.prepare,
            )
            _attach(app, owned)
        # Single jobs, what most requests carry, are enqueued on the event loop, on their
        # share of the connections (see pgqueue.AsyncProducer); the Queue's pool serves
        # the rest.
        producer = await AsyncProducer.open(
            app.state.queue,
            max_size=settings.enqueue_pool_size,
            pool_timeout=settings.pool_timeout,
        )
        app.state.producer = producer
        if not settings.auth_required:
            log.warning(
                "no API tokens are configured: anyone who can reach this API can enqueue, "
                "cancel and retry jobs (set PGQUEUE_API_TOKENS or --token-file)"
            )
        try:
            yield
        finally:
            del app.state.producer
            await producer.close()
            if owned is not None:
                await anyio.to_thread.run_sync(owned.close)

    app = FastAPI(
        title="pgqueue API",
        version=metadata.version("pgqueue-api"),
        description=DESCRIPTION,
        lifespan=lifespan,
        redoc_url=None,
        # Served by install_docs from local assets, so /docs works offline.
        docs_url=None,
    )
    app.state.settings = settings
    if queue is not None:
        _attach(app, queue)

    protected: RouterOptions = {
        "dependencies": [Depends(BEARER_SCHEME)] if settings.auth_required else [],
        "responses": (
            {401: {"model": ErrorResponse, "description": "A valid bearer token is required."}}
            if settings.auth_required
            else {}
        ),
    }
    app.include_router(jobs_router, **protected)
    app.include_router(queues_router, **protected)
    app.include_router(queue_control_router, **protected)
    app.include_router(workers_router, **protected)
    app.include_router(schedules_router, **protected)
    app.include_router(metrics_router, **({} if settings.public_metrics else protected))
    app.include_router(health_router)
    install_error_handlers(app)
    install_docs(app)
    public_prefixes = [ASSETS_PATH]
    if settings.ui:
        # Imported only when served: with --no-ui no template is even loaded.
        from pgqueue_api.ui import PUBLIC_PREFIXES, install_ui

        install_ui(app)
        public_prefixes += PUBLIC_PREFIXES

    # Added innermost first: authentication runs before the body is even read, and the
    # common POST /jobs is served once both have passed it.
    app.add_middleware(SingleEnqueueMiddleware, state=app.state)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.auth_required:
        public = {*DOCS_PATHS, "/healthz"}
        if settings.public_metrics:
            public.add("/metrics")
        app.add_middleware(
            BearerAuthMiddleware,
            tokens=settings.tokens,
            public_paths=public,
            public_prefixes=public_prefixes,
        )
    # Outermost: every answer, refused ones too, carries its request id.
    app.add_middleware(RequestIdMiddleware)
    return app


def create_app_from_env() -> FastAPI:
    """The app for the settings in the environment: the factory the ``pgqueue-api``
    server's uvicorn workers import. A process of the server's own, so its garbage
    collector is tuned as a worker's is (see :mod:`pgqueue.gc_tuning`)."""
    app = create_app(ApiSettings.from_env())
    tune_garbage_collector()
    return app


def _attach(app: FastAPI, queue: Queue) -> None:
    app.state.queue = queue
    app.state.metrics_registry = metrics_registry(queue)
