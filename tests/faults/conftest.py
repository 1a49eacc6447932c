"""Fixtures of the fault scenarios: private PostgreSQL clusters that may be crashed,
failed over, filled or cut off, and the figures each scenario reports.

No scenario touches the shared servers. Every cluster is private (its own directory and
loopback port) and removed afterwards. Its binaries follow the suite's server: with
``DATABASE_URL`` pointing at PostgreSQL 15 they are the machine's PostgreSQL 15, without
it the embedded PostgreSQL 18, so the scenarios run on both versions.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fault_sql
import pytest
from fault_results import FaultResults

from pgqueue_bench.infra.binaries import Binaries, binaries_for
from pgqueue_bench.infra.servers import PrivateServer, quiet_pool_logs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every scenario starts private servers and real worker processes.
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def postgres_binaries() -> Binaries:
    """The PostgreSQL installation the private clusters run (same major version as
    ``DATABASE_URL``'s server, else the embedded one)."""
    quiet_pool_logs()
    return binaries_for(os.environ.get("DATABASE_URL"))


@pytest.fixture(scope="session")
def fault_results(postgres_binaries: Binaries) -> Iterator[FaultResults]:
    """The figures of every scenario this process runs, merged into
    results/faults.json at the end of the session."""
    collected = FaultResults(postgres_binaries)
    yield collected
    collected.write()


@pytest.fixture
def record_figures(
    fault_results: FaultResults, request: pytest.FixtureRequest
) -> Callable[..., None]:
    """``record_figures("01-server-crash", figures)`` files a scenario's figures."""

    def record(scenario: str, figures: dict[str, Any]) -> None:
        fault_results.add(scenario, request.node.nodeid, figures)

    return record


@pytest.fixture
def start_server(postgres_binaries: Binaries) -> Iterator[Callable[..., PrivateServer]]:
    """Create and start a private cluster (keyword arguments go to PrivateServer);
    every cluster started is destroyed after the test."""
    started: list[PrivateServer] = []

    def start(**options: Any) -> PrivateServer:
        server = PrivateServer(postgres_binaries, **options)
        started.append(server)
        server.create()
        return server.start()

    yield start
    for server in reversed(started):
        server.destroy()


@pytest.fixture(scope="module")
def shared_server(postgres_binaries: Binaries) -> Iterator[PrivateServer]:
    """One private cluster for a module whose scenarios do not harm the server itself;
    each test works in a database of its own (``server_database``)."""
    with PrivateServer(postgres_binaries) as server:
        yield server


@pytest.fixture
def server_database(shared_server: PrivateServer) -> Iterator[str]:
    """The URL of a new database on the module's private cluster, dropped afterwards."""
    name = f"faults_{uuid.uuid4().hex[:10]}"
    fault_sql.run(shared_server.url(), "database_create", database=name)
    yield shared_server.url(name)
    fault_sql.run(shared_server.url(), "database_drop", database=name)
