"""Every flag of ``pgqueue-api`` can come from its environment variable: one case per
variable, each a real ``pgqueue-api`` process whose behaviour shows the setting took
effect. A flag wins over its variable, and the variable over the default."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
from api_support import TOKEN, free_port, wait_until_healthy
from polling import wait_for
from processes import stop
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue import Queue

PGQUEUE_API = str(Path(sys.executable).parent / "pgqueue-api")

pytestmark = pytest.mark.slow


@dataclass
class Api:
    """A running pgqueue-api process, as a check sees it."""

    base: str
    port: int
    log_path: Path
    app_name: str
    db: psycopg.Connection
    schema: str

    def log(self) -> str:
        return self.log_path.read_text()

    def connections(self) -> int:
        """The API's connections to the database (they carry its application_name)."""
        row = self.db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (self.app_name,),
        ).fetchone()
        return row[0]


@dataclass
class Case:
    env: dict[str, str]
    check: Callable[[Api], None]
    args: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port_from_env: bool = False
    migrated: bool = True


def _body_of(size: int) -> bytes:
    """A POST /jobs body of exactly ``size`` bytes."""
    head, tail = b'{"task": "echo", "payload": {"pad": "', b'"}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _post(api: Api, body: bytes, **headers: str) -> int:
    headers = {"content-type": "application/json", **headers}
    return httpx.post(f"{api.base}/jobs", content=body, headers=headers).status_code


def check_body_limit_200(api: Api) -> None:
    assert _post(api, _body_of(400)) == 413
    assert _post(api, _body_of(150)) == 201


def check_body_limit_from_the_flag(api: Api) -> None:
    assert _post(api, _body_of(400)) == 201
    assert _post(api, _body_of(1200)) == 413


def check_pool_of_four(api: Api) -> None:
    # Many requests at once make both pools grow, to their limits and no further: two
    # connections for single-job enqueues, two for every other request.
    def load() -> None:
        with httpx.Client() as client:
            for n in range(25):
                assert client.get(f"{api.base}/jobs?limit=1").status_code == 200
                answer = client.post(f"{api.base}/jobs", json={"task": "echo", "payload": {"n": n}})
                assert answer.status_code == 201

    most = 0

    def grown() -> bool:
        nonlocal most
        threads = [threading.Thread(target=load) for _ in range(16)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            most = max(most, api.connections())
        for thread in threads:
            thread.join()
        return most >= 4

    wait_for(grown, timeout=60, what="the pools to grow", interval=0)
    assert most == 4


def check_public_metrics(api: Api) -> None:
    assert httpx.get(f"{api.base}/metrics").status_code == 200
    assert httpx.get(f"{api.base}/jobs").status_code == 401


def check_token_file(api: Api) -> None:
    assert httpx.get(f"{api.base}/jobs").status_code == 401
    answer = httpx.get(f"{api.base}/jobs", headers={"Authorization": "Bearer from-the-file"})
    assert answer.status_code == 200


def check_prepare_off(api: Api) -> None:
    assert "prepared statements off" in api.log()


def check_host(api: Api) -> None:
    assert httpx.get(f"{api.base}/healthz").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{api.port}/healthz")


def check_port(api: Api) -> None:
    assert httpx.get(f"{api.base}/healthz").status_code == 200


def check_two_workers(api: Api) -> None:
    wait_for(lambda: api.log().count("Started server process") == 2, 60, "two workers")


def check_migrated(api: Api) -> None:
    assert _post(api, _body_of(100)) == 201


def check_no_access_log(api: Api) -> None:
    assert _post(api, _body_of(100)) == 201
    wait_for(lambda: "Application startup complete" in api.log(), 30, "the startup line")
    assert "POST /jobs" not in api.log()


def check_log_level_warning(api: Api) -> None:
    assert _post(api, _body_of(100)) == 201
    assert "Application startup complete" not in api.log()
    assert "POST /jobs" not in api.log()


def check_schema(api: Api) -> None:
    created = httpx.post(f"{api.base}/jobs", json={"task": "echo", "payload": {"n": 7}})
    with Queue.connect(api.db.info.dsn, schema=api.schema, min_size=1, max_size=1) as queue:
        assert queue.get(created.json()["id"]).payload == {"n": 7}


CASES = {
    "PGQUEUE_API_MAX_BODY_BYTES": Case({"PGQUEUE_API_MAX_BODY_BYTES": "200"}, check_body_limit_200),
    "flag over PGQUEUE_API_MAX_BODY_BYTES": Case(
        {"PGQUEUE_API_MAX_BODY_BYTES": "200"},
        check_body_limit_from_the_flag,
        args=["--max-body-bytes", "1000"],
    ),
    "PGQUEUE_API_POOL_SIZE": Case({"PGQUEUE_API_POOL_SIZE": "4"}, check_pool_of_four),
    "PGQUEUE_API_PUBLIC_METRICS": Case(
        {"PGQUEUE_API_PUBLIC_METRICS": "1", "PGQUEUE_API_TOKENS": TOKEN}, check_public_metrics
    ),
    "PGQUEUE_API_TOKEN_FILE": Case({"PGQUEUE_API_TOKEN_FILE": "TOKEN_FILE"}, check_token_file),
    "PGQUEUE_API_NO_PREPARE": Case({"PGQUEUE_API_NO_PREPARE": "1"}, check_prepare_off),
    "PGQUEUE_NO_PREPARE": Case({"PGQUEUE_NO_PREPARE": "1"}, check_prepare_off),
    "PGQUEUE_API_PREPARE": Case({"PGQUEUE_API_PREPARE": "0"}, check_prepare_off),
    "PGQUEUE_API_HOST": Case({"PGQUEUE_API_HOST": "127.0.0.2"}, check_host, host="127.0.0.2"),
    "PGQUEUE_API_PORT": Case({}, check_port, port_from_env=True),
    "PGQUEUE_API_WORKERS": Case({"PGQUEUE_API_WORKERS": "2"}, check_two_workers),
    "PGQUEUE_API_MIGRATE": Case({"PGQUEUE_API_MIGRATE": "1"}, check_migrated, migrated=False),
    "PGQUEUE_API_ACCESS_LOG": Case({"PGQUEUE_API_ACCESS_LOG": "0"}, check_no_access_log),
    "PGQUEUE_API_LOG_LEVEL": Case({"PGQUEUE_API_LOG_LEVEL": "warning"}, check_log_level_warning),
    "PGQUEUE_DATABASE_URL and PGQUEUE_SCHEMA": Case({}, check_schema),
}


@contextmanager
def running_api(
    case: Case, database_url: str, schema: str, tmp_path: Path, db: psycopg.Connection
) -> Iterator[Api]:
    port = free_port()
    app_name = f"pgq_env_{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.pop("DATABASE_URL", None)
    env["PGQUEUE_DATABASE_URL"] = make_conninfo(database_url, application_name=app_name)
    env["PGQUEUE_SCHEMA"] = schema
    token_file = tmp_path / "tokens"
    token_file.write_text("from-the-file\n")
    env.update({k: str(token_file) if v == "TOKEN_FILE" else v for k, v in case.env.items()})
    args = list(case.args)
    if case.port_from_env:
        env["PGQUEUE_API_PORT"] = str(port)
    else:
        args += ["--port", str(port)]
    log_path = tmp_path / "api.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [PGQUEUE_API, *args], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    base = f"http://{case.host}:{port}"
    try:
        wait_until_healthy(process, base, log_path.read_text)
        yield Api(base, port, log_path, app_name, db, schema)
    finally:
        stop([process], timeout=30)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_flag_of_pgqueue_api_takes_its_environment_variable(
    case: Case, database_url: str, schema: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    if not case.migrated:
        schema = f"env_{uuid.uuid4().hex[:12]}"
    try:
        with running_api(case, database_url, schema, tmp_path, db) as api:
            case.check(api)
    finally:
        if not case.migrated:
            db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_every_flag_of_pgqueue_api_names_its_environment_variable_in_help() -> None:
    from pgqueue_api.cli import api

    names = {name for param in api.params if param.envvar for name in _names(param.envvar)}
    # --help and --version describe the command; they configure nothing.
    undocumented = [
        p.name for p in api.params if not p.envvar and p.name not in ("help", "version")
    ]
    assert undocumented == []
    help_text = " ".join(
        subprocess.run([PGQUEUE_API, "--help"], capture_output=True, text=True, check=True)
        .stdout.replace("\n", " ")
        .split()
    )
    for name in names:
        assert name in help_text
    # Each variable the settings read is one a flag reads too (or the tokens, which
    # have no flag: a secret does not belong on a command line).
    for name in ("PGQUEUE_API_MAX_BODY_BYTES", "PGQUEUE_API_POOL_SIZE", "PGQUEUE_API_TOKEN_FILE"):
        assert name in names


def _names(envvar: str | list[str]) -> list[str]:
    return [envvar] if isinstance(envvar, str) else list(envvar)
