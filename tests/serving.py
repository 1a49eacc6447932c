"""Serving an ASGI app (the real pgqueue API) under uvicorn on a thread, on a free
loopback port, so that tests talk HTTP to it as clients would."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from polling import wait_for


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread (lifespan included); yield its base URL.
    The socket is bound before the server starts, so the port cannot be taken meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), 60, what="the API to start")
        assert server.started, "the API did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
