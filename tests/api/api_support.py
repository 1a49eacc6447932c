"""Helpers for the HTTP API tests: free ports, and serving the real app under uvicorn in
a thread, so tests talk HTTP to it with httpx."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI
from polling import wait_for

TOKEN = "test-token-0123456789"


def free_port() -> int:
    """A loopback port nothing listens on (free when asked; good enough for a test)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread (lifespan included); yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), what="the API to start")
        assert server.started, "the API did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@dataclass
class RunningApi:
    """An API being served for a test."""

    url: str
    client: httpx.Client
    app: FastAPI
