"""Helpers for the HTTP API tests: the API token they use, free ports, and the running
API handed to a test."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import httpx
from fastapi import FastAPI

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
