"""Body limits (413 before parsing) and bearer-token authentication (401)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from api_support import TOKEN, RunningApi

from pgqueue_api.settings import (
    DEFAULT_MAX_BODY_BYTES,
    ApiSettings,
    SettingsError,
    read_token_file,
)

MIB = 1024 * 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _two_mib_json() -> bytes:
    return b'{"task": "echo", "payload": {"blob": "' + b"x" * (2 * MIB) + b'"}}'


def _chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def test_two_mib_body_is_413(api: httpx.Client):
    response = api.post(
        "/jobs", content=_two_mib_json(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["detail"] == (
        f"request body is larger than {DEFAULT_MAX_BODY_BYTES} bytes"
    )


def test_two_mib_chunked_body_without_length_is_413(api: httpx.Client):
    request = api.build_request(
        "POST",
        "/jobs",
        content=_chunks(_two_mib_json()),
        headers={"content-type": "application/json"},
    )
    assert "content-length" not in request.headers
    assert request.headers["transfer-encoding"] == "chunked"
    response = api.send(request)
    assert response.status_code == 413


def test_the_connection_still_serves_requests_after_a_413(api: httpx.Client):
    assert api.post("/jobs/batch", content=_two_mib_json()).status_code == 413
    assert api.get("/healthz").status_code == 200


def test_body_limit_is_configurable_and_bodies_within_it_pass(start_api):
    small = start_api(max_body_bytes=100).client
    assert small.post("/jobs", json={"task": "echo"}).status_code == 201
    assert (
        small.post("/jobs", json={"task": "echo", "payload": {"x": "y" * 100}}).status_code == 413
    )
    chunked = small.build_request("POST", "/jobs", content=_chunks(b"{" + b" " * 200 + b"}", 10))
    assert small.send(chunked).status_code == 413


@pytest.fixture
def secured(start_api: Callable[..., RunningApi]) -> httpx.Client:
    return start_api(tokens=frozenset({TOKEN, "second-token"})).client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/jobs"),
        ("POST", "/jobs/batch"),
        ("GET", "/jobs"),
        ("GET", "/jobs/1"),
        ("POST", "/jobs/1/cancel"),
        ("POST", "/jobs/1/retry"),
        ("GET", "/queues"),
        ("PATCH", "/queues/default"),
        ("POST", "/queues/default/pause"),
        ("POST", "/queues/default/resume"),
        ("GET", "/workers"),
        ("GET", "/metrics"),
        ("GET", "/no-such-route"),
    ],
)
def test_every_route_needs_a_token_when_tokens_are_set(secured: httpx.Client, method, path):
    response = secured.request(method, path, json={"task": "echo"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    wrong = secured.request(method, path, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


def test_any_configured_token_is_accepted(secured: httpx.Client):
    for token in (TOKEN, "second-token"):
        headers = {"Authorization": f"Bearer {token}"}
        assert secured.post("/jobs", json={"task": "echo"}, headers=headers).status_code == 201
    assert secured.get("/jobs", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200
    assert secured.get("/jobs", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401


def test_health_and_docs_need_no_token(secured: httpx.Client):
    assert secured.get("/healthz").status_code == 200
    assert secured.get("/docs").status_code == 200
    spec = secured.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_unauthenticated_malformed_body_gets_401_not_422(secured: httpx.Client):
    response = secured.post("/jobs", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 401


def test_public_metrics_serves_metrics_without_a_token_but_nothing_else(start_api):
    client = start_api(tokens=frozenset({TOKEN}), public_metrics=True).client
    assert client.get("/metrics").status_code == 200
    assert client.get("/queues").status_code == 401
    assert client.get("/queues", headers=AUTH).status_code == 200


def test_open_api_needs_no_token(api: httpx.Client):
    assert api.get("/queues").status_code == 200
    assert api.get("/metrics").status_code == 200


def test_token_file_lists_one_token_per_line_ignoring_blanks_and_comments(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# producers\nalpha\n\n  beta  \n")
    assert read_token_file(path) == ["alpha", "beta"]
    with pytest.raises(SettingsError, match="cannot read token file"):
        read_token_file(tmp_path / "missing")


def test_settings_from_env_merge_token_list_and_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("from-file\n")
    settings = ApiSettings.from_env(
        {
            "DATABASE_URL": "postgresql://db/x",
            "PGQUEUE_API_TOKENS": "one, two,,",
            "PGQUEUE_API_TOKEN_FILE": str(path),
            "PGQUEUE_API_PUBLIC_METRICS": "true",
            "PGQUEUE_API_MAX_BODY_BYTES": "2048",
        }
    )
    assert settings.tokens == {"one", "two", "from-file"} and settings.auth_required
    assert settings.public_metrics and settings.max_body_bytes == 2048
    with pytest.raises(SettingsError, match="must be an integer"):
        ApiSettings.from_env({"DATABASE_URL": "x", "PGQUEUE_API_POOL_SIZE": "many"})


@pytest.mark.parametrize(("size", "enqueue", "rest"), [(2, 1, 1), (3, 1, 2), (10, 5, 5)])
def test_the_pool_size_is_shared_by_single_enqueues_and_everything_else(size, enqueue, rest):
    settings = ApiSettings(database_url="x", pool_size=size)
    assert (settings.enqueue_pool_size, settings.queue_pool_size) == (enqueue, rest)
    with pytest.raises(SettingsError, match="at least 2"):
        ApiSettings(database_url="x", pool_size=1)
