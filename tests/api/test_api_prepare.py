"""The API can run without server-side prepared statements, as PgBouncer needs."""

from fastapi.testclient import TestClient

from pgqueue_api.app import create_app
from pgqueue_api.settings import ApiSettings


def test_prepare_is_on_by_default_and_off_with_the_environment_switch(database_url):
    assert ApiSettings.from_env({"DATABASE_URL": database_url}).prepare is True
    off = ApiSettings.from_env({"DATABASE_URL": database_url, "PGQUEUE_API_PREPARE": "0"})
    assert off.prepare is False


def test_an_api_without_prepared_statements_opens_its_pool_so(database_url, schema):
    app = create_app(ApiSettings(database_url=database_url, schema=schema, prepare=False))
    with TestClient(app) as client:
        assert client.post("/jobs", json={"task": "echo"}).status_code == 201
        queue = app.state.queue
        assert queue.pool.kwargs["prepare_threshold"] is None
