"""Tokens never reach the logs: the real ``pgqueue-api`` process, access log on and at
debug level, answering right and wrong tokens, on its success and error paths."""

from __future__ import annotations

import httpx
import pytest
from surfaces import AUTH
from ui_support import TOKEN, csrf_of

WRONG = "wrong-secret-4242-do-not-log"


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_tokens_right_or_wrong_never_appear_in_the_logs(
    start_process, refuse_poison, log_format: str
):
    api = start_process("--access-log", "--log-level", "debug", "--log-format", log_format)
    wrong = {"Authorization": f"Bearer {WRONG}"}
    with httpx.Client(base_url=api.url, timeout=30) as client:
        assert client.post("/jobs", json={"task": "echo"}, headers=AUTH).status_code == 201
        assert client.get("/jobs", headers=AUTH).status_code == 200
        assert client.get("/jobs", headers=wrong).status_code == 401
        assert client.get("/queues").status_code == 401
        # 422s: a malformed body and a job the API refuses, with either token.
        for headers in (AUTH, wrong):
            client.post(
                "/jobs", content=b"{nope", headers={**headers, "content-type": "application/json"}
            )
        assert client.post("/jobs", json={"task": "<b>"}, headers=AUTH).status_code == 422
        assert client.get("/jobs?limit=-1", headers=AUTH).status_code == 422
        # 413.
        big = {"task": "echo", "payload": {"x": "y" * 2_000_000}}
        with httpx.Client(base_url=api.url, timeout=30) as uploader:
            assert uploader.post("/jobs", json=big, headers=AUTH).status_code == 413
        # A statement the database refuses (a trigger raises): the API's 500 path, on a
        # connection of its own (uvicorn closes the connection after a 500).
        with httpx.Client(base_url=api.url, timeout=30) as failing:
            failed = failing.post("/jobs", json={"task": "poison"}, headers=AUTH)
            assert failed.status_code == 500
        # 404.
        assert client.get("/jobs/999999", headers=AUTH).status_code == 404
        # The dashboard's login form, given the wrong token and then the right one.
        form = client.get("/ui/login")
        for token, status in ((WRONG, 401), (TOKEN, 303)):
            answer = client.post(
                "/ui/login", data={"csrf_token": csrf_of(form.text), "token": token, "next": "/ui"}
            )
            assert answer.status_code == status
        assert client.get("/ui").status_code == 200
    log = api.log()
    # The logs were written (access lines and the 500's report), just not the tokens.
    assert "/jobs" in log and "/ui/login" in log
    assert "poison" in log
    assert TOKEN not in log
    assert WRONG not in log
