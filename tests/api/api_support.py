"""Helpers for the HTTP API tests: the API token they use, free ports, and the running
API handed to a test."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from fastapi import FastAPI
from polling import wait_for

TOKEN = "test-token-0123456789"


def free_port() -> int:
    """A loopback port nothing listens on (free when asked; good enough for a test)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class RunningApi:
    """An API being served for a test."""

    url: str
    client: httpx.Client
    app: FastAPI


def wait_until_healthy(
    process: subprocess.Popen, base_url: str, exit_output: Callable[[], str]
) -> None:
    """Wait until the API process answers ``/healthz`` with 200; fail at once, with
    ``exit_output()``, if it exits first."""

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the API exited: {exit_output()}")
        try:
            return httpx.get(f"{base_url}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, timeout=60, interval=0.1, what="the API to answer")
