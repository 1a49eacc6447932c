"""The dashboard's guards, spoken to over HTTP as a browser would: sessions, CSRF
tokens, headers, the open dashboard's banner and ``--no-ui``."""

from __future__ import annotations

import httpx
import pytest
from ui_support import TOKEN, csrf_of, logged_in_client

from pgqueue import JobState, Queue

pytestmark = pytest.mark.slow


def test_without_a_session_pages_go_to_login_and_fragments_answer_401(start_api, queue: Queue):
    api = start_api()
    job = queue.enqueue("echo", {}, queue="later").job
    with httpx.Client(base_url=api.url, timeout=30) as anonymous:
        page = anonymous.get("/ui/jobs?queue=later")
        assert page.status_code == 303
        assert page.headers["location"] == "/ui/login?next=%2Fui%2Fjobs%3Fqueue%3Dlater"
        fragment = anonymous.get("/ui/fragments/queues")
        assert fragment.status_code == 401
        # After logging in, the page that polled it.
        assert fragment.headers["hx-redirect"] == "/ui/login?next=%2Fui"
        job_part = anonymous.get(f"/ui/fragments/jobs/{job.id}")
        assert job_part.headers["hx-redirect"] == f"/ui/login?next=%2Fui%2Fjobs%2F{job.id}"
        # An action without a session does nothing.
        login = anonymous.get("/ui/login")
        refused = anonymous.post(
            f"/ui/jobs/{job.id}/cancel", data={"csrf_token": csrf_of(login.text)}
        )
        assert refused.status_code == 303
        assert refused.headers["location"].startswith("/ui/login")
        # A session cookie made up or signed with another key is no session.
        anonymous.cookies.set("pgqueue_session", "9999999999.nonce.0123abcd", path="/ui")
        assert anonymous.get("/ui").status_code == 303
    assert queue.get(job.id).state is JobState.QUEUED


def test_login_sets_a_strict_httponly_session_that_a_wrong_token_does_not_get(start_api):
    api = start_api()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        form = client.get("/ui/login")
        assert form.status_code == 200
        wrong = client.post(
            "/ui/login", data={"csrf_token": csrf_of(form.text), "token": "not-it", "next": "/ui"}
        )
        assert wrong.status_code == 401
        assert "That token is not valid." in wrong.text
        assert "pgqueue_session" not in client.cookies
        right = client.post(
            "/ui/login", data={"csrf_token": csrf_of(form.text), "token": TOKEN, "next": "/ui"}
        )
        assert right.status_code == 303
        cookie = next(
            header
            for header in right.headers.get_list("set-cookie")
            if header.startswith("pgqueue_session=")
        )
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        assert "Secure" not in cookie  # served over plain HTTP here
        assert client.get("/ui").status_code == 200
        # The session is the dashboard's: the JSON API still wants its bearer token.
        assert client.get("/jobs").status_code == 401

    # Served over TLS (here: through a proxy on this host that says so), it is Secure.
    # (The client, speaking plain HTTP, would not send a Secure cookie back by itself.)
    tls = {"X-Forwarded-Proto": "https"}
    form = httpx.get(f"{api.url}/ui/login", headers=tls)
    assert "Secure" in form.headers["set-cookie"]
    answer = httpx.post(
        f"{api.url}/ui/login",
        data={"csrf_token": csrf_of(form.text), "token": TOKEN, "next": "/ui"},
        headers={**tls, "Cookie": f"pgqueue_csrf={form.cookies['pgqueue_csrf']}"},
    )
    assert answer.status_code == 303
    cookies = answer.headers.get_list("set-cookie")
    assert any(c.startswith("pgqueue_session=") and "Secure" in c for c in cookies)


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(start_api, queue: Queue):
    api = start_api()
    job = queue.enqueue("echo", {}, queue="later").job
    with logged_in_client(api.url) as client, logged_in_client(api.url) as other_browser:
        missing = client.post(f"/ui/jobs/{job.id}/cancel", data={})
        assert missing.status_code == 403
        assert "no valid CSRF token" in missing.text
        # Another browser's token (its own session and CSRF cookie) does not do either.
        foreign = csrf_of(other_browser.get("/ui").text)
        assert (
            client.post(f"/ui/jobs/{job.id}/cancel", data={"csrf_token": foreign}).status_code
            == 403
        )
        bulk = client.post("/ui/jobs", data={"action": "cancel", "job_id": str(job.id)})
        assert bulk.status_code == 403
        assert queue.get(job.id).state is JobState.QUEUED

        token = csrf_of(client.get(f"/ui/jobs/{job.id}").text)
        done = client.post(f"/ui/jobs/{job.id}/cancel", data={"csrf_token": token})
        assert done.status_code == 303
        assert queue.get(job.id).state is JobState.CANCELLED


def test_pages_forbid_framing_and_inline_script(start_api):
    api = start_api()
    with logged_in_client(api.url) as client:
        for path in ("/ui", "/ui/jobs", "/ui/login", "/ui/fragments/queues"):
            answer = client.get(path, follow_redirects=True)
            assert answer.headers["x-frame-options"] == "DENY", path
            policy = answer.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy
            assert "script-src 'self'" in policy
            assert answer.headers["cache-control"] == "no-store"


def test_with_no_tokens_the_dashboard_says_it_is_open(start_api):
    api = start_api(tokens=None)
    with httpx.Client(base_url=api.url, timeout=30) as client:
        page = client.get("/ui")
        assert page.status_code == 200
        assert "open to anyone who can reach them" in page.text
        assert client.get("/ui/login").headers["location"] == "/ui"


def test_no_ui_serves_no_dashboard_but_docs_still_work(start_api):
    api = start_api("--no-ui")
    with httpx.Client(base_url=api.url, timeout=30) as client:
        assert client.get("/ui").status_code == 401  # bearer-protected, and absent
        authorized = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/ui", headers=authorized).status_code == 404
        assert client.get("/ui/static/htmx.min.js", headers=authorized).status_code == 404
        assert client.get("/docs").status_code == 200
        assert client.get("/docs/assets/swagger-ui-bundle.js").status_code == 200
    assert "dashboard off" in api.log()
