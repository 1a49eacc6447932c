"""The dashboard against a hostile browser and hostile data: CSRF on every
state-changing route (enumerated from the app), markup in every field it shows,
framing, cookies and redirects."""

from __future__ import annotations

from collections.abc import Callable
from html.parser import HTMLParser

import httpx
import pytest
from api_support import RunningApi
from psycopg import sql
from surfaces import AUTH, endpoints
from ui_support import TOKEN, csrf_of, logged_in_client

from pgqueue import JobState, Queue, WorkerProtocol, WorkerRegistration
from pgqueue.schedules import Schedule
from pgqueue_api.ui import security

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
MARKUP = [SCRIPT, IMG, "'><svg onload=alert(1)>", "javascript:alert(1)//</textarea>"]
HOSTILE = SCRIPT + IMG
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
PLUGIN = "plugin" + IMG  # a plugin's name is shown as a schedule's source


class _Elements(HTMLParser):
    """The start tags of a page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {name: value or "" for name, value in attrs}))


def _assert_no_live_markup(html: str, where: str) -> None:
    """No markup from the data came through as markup: escaping turns every < into
    &lt;, so none of it can appear as it is, and the page's elements are the
    dashboard's own: no images, no event handlers, no script but its own files."""
    for raw in ("<script>alert", "<img src=x", "<svg onload", "</textarea>"):
        assert raw not in html, f"{where}: {raw!r} is not escaped"
    parser = _Elements()
    parser.feed(html)
    for tag, attributes in parser.tags:
        # (The charts are the dashboard's own SVG, so <svg> itself may appear.)
        assert tag not in ("img", "iframe", "object", "embed"), f"{where}: <{tag}>"
        if tag == "script":
            assert attributes.get("src", "").startswith("/ui/static/"), f"{where}: {attributes}"
        for name, value in attributes.items():
            assert not name.startswith("on"), f"{where}: <{tag} {name}=...>"
            assert not value.strip().lower().startswith("javascript:"), f"{where}: {name}"


def _paused(queue: Queue, name: str) -> bool:
    return next(stats for stats in queue.stats() if stats.queue == name).paused


def _state_changing(api: RunningApi) -> list:
    # Static files (a mount) change nothing whatever the method.
    return [
        e
        for e in endpoints(api.app)
        if e.dashboard and e.method in UNSAFE_METHODS and not e.mounted
    ]


def test_every_state_changing_dashboard_route_refuses_a_cross_site_post(
    start_app: Callable[..., RunningApi], queue: Queue
):
    api = start_app()
    job = queue.enqueue("echo", {}, queue="later").job
    assert job.id == 1  # the id the enumerated routes are sent with
    queue.sync_schedules({"nightly": Schedule("nightly", "30 2 * * *", "echo")}, ["p"])
    actions = _state_changing(api)
    # Every dashboard form is a POST; the enumeration found them all.
    assert {e.path for e in actions} >= {
        "/ui/login",
        "/ui/logout",
        "/ui/jobs",
        "/ui/jobs/1/cancel",
        "/ui/jobs/1/retry",
        "/ui/queues/pause",
        "/ui/queues/resume",
        "/ui/queues/limits",
        "/ui/schedules/enable",
        "/ui/schedules/disable",
    }
    # Form fields each action would act on, were its CSRF token valid.
    fields = {
        "queue": "later",
        "name": "nightly",
        "action": "cancel",
        "job_id": "1",
        "concurrency_limit": "1",
        "token": TOKEN,
        "next": "/ui",
    }
    cross_site = {
        "Origin": "https://evil.example",
        "Referer": "https://evil.example/attack.html",
        "Sec-Fetch-Site": "cross-site",
    }
    with logged_in_client(api.url) as client, logged_in_client(api.url) as other_browser:
        queue.sync_schedules({"nightly": Schedule("nightly", "30 2 * * *", "echo")}, ["p"])
        others = csrf_of(other_browser.get("/ui").text)
        attempts = {
            "no token, another site": ({}, cross_site),
            "no token": ({}, {}),
            "empty token": ({"csrf_token": ""}, {}),
            "made-up token": ({"csrf_token": "0" * 64}, cross_site),
            "another browser's token": ({"csrf_token": others}, cross_site),
        }
        for endpoint in actions:
            for what, (token, headers) in attempts.items():
                answer = client.post(endpoint.path, data={**fields, **token}, headers=headers)
                assert answer.status_code == 403, f"{endpoint} with {what}: {answer.status_code}"
                assert "no valid CSRF token" in answer.text
        # Nothing changed, and the browser is still logged in.
        assert queue.get(job.id).state is JobState.QUEUED
        assert not _paused(queue, "later")
        assert queue.schedules()[0].enabled
        assert client.get("/ui").status_code == 200

        # The same forms with the page's own token do act: the refusals were the token's.
        mine = csrf_of(client.get("/ui").text)
        assert (
            client.post("/ui/queues/pause", data={**fields, "csrf_token": mine}).status_code == 303
        )
        assert _paused(queue, "later")
        assert (
            client.post("/ui/schedules/disable", data={**fields, "csrf_token": mine}).status_code
            == 303
        )
        assert not queue.schedules()[0].enabled
        assert client.post("/ui/jobs/1/cancel", data={"csrf_token": mine}).status_code == 303
        assert queue.get(job.id).state is JobState.CANCELLED


def test_a_get_changes_nothing(start_app, queue: Queue):
    # Actions are POSTs only: a link or an <img> on another site cannot act.
    api = start_app()
    job = queue.enqueue("echo", {}, queue="later").job
    with logged_in_client(api.url) as client:
        for path in (f"/ui/jobs/{job.id}/cancel", "/ui/queues/pause?queue=later"):
            assert client.get(path).status_code in (404, 405, 422)
    assert queue.get(job.id).state is JobState.QUEUED


def test_names_cannot_carry_markup(start_app, queue: Queue):
    # Task and queue names are patterns of letters, digits and _.:-; markup reaches the
    # dashboard only through free-text fields (below).
    client = start_app().client
    for field in ("task", "queue"):
        for markup in MARKUP:
            job = {"task": "echo", field: markup}
            assert client.post("/jobs", json=job, headers=AUTH).status_code == 422
            with pytest.raises(ValueError):
                queue.enqueue(job["task"], {}, queue=job.get("queue", "default"))


def _hostile_data(queue: Queue) -> dict[str, int]:
    """Jobs, a worker and a schedule with markup in every free-text field."""
    protocol = WorkerProtocol(queue)
    payload = {markup: [markup, {"nested": markup}] for markup in MARKUP}
    shown = queue.enqueue(
        "echo", payload, queue="later", idempotency_key=HOSTILE, unique_key=HOSTILE
    ).job
    failed = queue.enqueue("flaky", {"x": SCRIPT}, max_attempts=1).job
    [claimed] = protocol.claim(["default"], ["flaky"], worker_id="worker" + IMG)
    protocol.fail(claimed, HOSTILE + "\n" + HOSTILE)
    queue.enqueue("echo", {}, queue="later")
    [claimed] = protocol.claim(["later"], ["echo"], limit=1)
    protocol.ack(claimed, {"out": MARKUP})
    queue.register_worker(
        WorkerRegistration(
            id="worker" + IMG,
            queues=["later", "default"],
            tasks=["echo", "flaky"],
            concurrency=1,
            expiry_seconds=300,
            host="host" + SCRIPT,
            version="1.0" + IMG,
        )
    )
    queue.sync_schedules(
        {
            "hostile": Schedule(
                "hostile", "30 2 * * *", "echo", payload={"x": HOSTILE}, source=PLUGIN
            )
        },
        [PLUGIN],
    )
    return {"shown": shown.id, "failed": failed.id, "succeeded": claimed.id}


def test_markup_in_every_field_renders_escaped_on_every_page(start_app, queue: Queue):
    api = start_app()
    ids = _hostile_data(queue)
    assert queue.get(ids["failed"]).state is JobState.DEAD
    with logged_in_client(api.url) as client:
        pages = {
            endpoint.path
            for endpoint in endpoints(api.app)
            if endpoint.dashboard and endpoint.method == "GET" and "{path}" not in endpoint.pattern
        }
        # Each job's page and fragment, filtered lists, a search that finds nothing
        # (the text searched for is shown back), and the login page's ``next``.
        for job_id in ids.values():
            pages |= {f"/ui/jobs/{job_id}", f"/ui/fragments/jobs/{job_id}"}
            pages |= {f"/ui/jobs/{job_id}/payload.json", f"/ui/jobs/{job_id}/result.json"}
            pages.add(f"/ui/jobs/{job_id}/workflow")
        pages |= {
            "/ui/jobs?queue=later",
            "/ui/jobs?state=dead",
            "/ui/fragments/jobs?state=dead",
            "/ui/jobs?" + httpx.QueryParams({"q": SCRIPT}).__str__(),
            "/ui/jobs?" + httpx.QueryParams({"q": "x" + IMG}).__str__(),
        }
        shown = ""
        for path in sorted(pages):
            answer = client.get(path)
            if answer.status_code == 303:
                continue  # a search that found a job goes to its page, read above
            assert answer.status_code in (200, 404), f"{path}: {answer.status_code}"
            if path.endswith(".json"):
                # Raw JSON, never HTML: a browser that opens it does not render it.
                if answer.status_code == 200:
                    assert answer.headers["content-type"].startswith("application/json")
                    assert answer.headers["x-content-type-options"] == "nosniff"
                continue
            _assert_no_live_markup(answer.text, path)
            shown += answer.text
        # The data was shown, escaped (so the checks above looked at it).
        for escaped in (
            "&lt;script&gt;alert(1)&lt;/script&gt;",
            "&lt;img src=x onerror=alert(1)&gt;",
        ):
            assert escaped in shown
        for page, expected in {
            f"/ui/jobs/{ids['shown']}": "&#34;nested&#34;",  # the payload
            f"/ui/jobs/{ids['failed']}": "&lt;script&gt;alert(1)",  # last_error, errors
            "/ui/workers": "host&lt;script&gt;",
            "/ui/schedules": "plugin&#34;&gt;&lt;img",
        }.items():
            assert expected in client.get(page).text, page

    with httpx.Client(base_url=api.url, timeout=30) as anonymous:
        login = anonymous.get("/ui/login", params={"next": "/ui" + IMG + SCRIPT})
        _assert_no_live_markup(login.text, "/ui/login?next=")


def test_markup_in_names_written_by_another_client_is_escaped_in_a_workflow(
    start_app, queue: Queue, db, schema: str
):
    # pgqueue refuses markup in task and queue names, but another client writing rows
    # by hand is not pgqueue: the graph and the lists of linked jobs escape them too.
    first = queue.enqueue("extract", {}).job
    second = queue.enqueue("load", {}, depends_on=[first.id]).job
    third = queue.enqueue("report", {}, depends_on=[second.id]).job
    db.execute(
        sql.SQL("UPDATE {}.active_jobs SET task = %s, queue = %s WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        (HOSTILE, "q" + IMG, second.id),
    )
    api = start_app()
    with logged_in_client(api.url) as client:
        for path in (
            f"/ui/jobs/{second.id}/workflow",
            f"/ui/jobs/{first.id}/workflow",
            f"/ui/jobs/{first.id}",
            f"/ui/jobs/{third.id}",
            f"/ui/fragments/jobs/{third.id}",
        ):
            answer = client.get(path)
            assert answer.status_code == 200, path
            _assert_no_live_markup(answer.text, path)
            assert "&lt;script&gt;" in answer.text, path  # shown, as text
        graph = client.get(f"/ui/jobs/{first.id}/workflow").text
        # The tooltip carries all of it, escaped; the box a cut of it.
        assert f"<title>Job {second.id}: &lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;" in graph
        as_json = client.get(f"/jobs/{first.id}/workflow", headers=AUTH)
        assert as_json.headers["content-type"].startswith("application/json")
        assert HOSTILE in {job["task"] for job in as_json.json()["jobs"]}


@pytest.mark.slow
def test_markup_does_not_run_in_a_browser(start_process, page, queue: Queue):
    # The HTML checks above, confirmed by Chromium: no dialog opens, no image with an
    # onerror is created, on any page that shows the data.
    from ui_support import log_in

    ids = _hostile_data(queue)
    api = start_process()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, api.url)
    for path in (
        "/ui",
        "/ui/jobs",
        "/ui/jobs?state=dead",
        f"/ui/jobs/{ids['shown']}",
        f"/ui/jobs/{ids['failed']}",
        f"/ui/jobs/{ids['failed']}/workflow",
        "/ui/workers",
        "/ui/schedules",
    ):
        page.goto(api.url + path)
        page.wait_for_load_state("networkidle")
        assert page.locator("img[onerror], svg[onload]").count() == 0, path
    page.goto(f"{api.url}/ui/jobs/{ids['failed']}")
    assert SCRIPT in page.inner_text("body")  # shown as text
    assert dialogs == []


def test_every_dashboard_answer_forbids_framing(start_app, queue: Queue):
    api = start_app()
    queue.enqueue("echo", {}, queue="later")
    with logged_in_client(api.url) as client, httpx.Client(base_url=api.url) as anonymous:
        for endpoint in endpoints(api.app):
            if not endpoint.dashboard:
                continue
            for browser in (client, anonymous):
                data = {"data": {}} if endpoint.method in UNSAFE_METHODS else {}
                answer = browser.request(endpoint.method, endpoint.path, **data)
                # Pages, redirects, refusals, errors and static files alike.
                assert answer.headers.get("x-frame-options") == "DENY", endpoint
                policy = answer.headers.get("content-security-policy", "")
                assert "frame-ancestors 'none'" in policy, endpoint
                assert "script-src 'self'" in policy and "unsafe-inline" not in policy
                assert answer.headers.get("x-content-type-options") == "nosniff"


def _set_cookies(answer: httpx.Response) -> dict[str, str]:
    return {header.split("=", 1)[0]: header for header in answer.headers.get_list("set-cookie")}


@pytest.mark.slow
@pytest.mark.parametrize("tls", [False, True], ids=["http", "https-by-proxy"])
def test_every_cookie_is_httponly_strict_and_secure_over_tls(start_process, tls: bool):
    # The real process: uvicorn trusts X-Forwarded-Proto from a proxy on this host.
    api = start_process()
    headers = {"X-Forwarded-Proto": "https"} if tls else {}
    with httpx.Client(base_url=api.url, timeout=30, headers=headers) as client:
        form = client.get("/ui/login")
        cookies = _set_cookies(form)
        # The client speaks plain HTTP and so would not send a Secure cookie back.
        csrf = form.cookies[security.CSRF_COOKIE]
        answer = client.post(
            "/ui/login",
            data={"csrf_token": csrf_of(form.text), "token": TOKEN, "next": "/ui"},
            headers={"Cookie": f"{security.CSRF_COOKIE}={csrf}"},
        )
        assert answer.status_code == 303
        cookies |= _set_cookies(answer)
        session = answer.cookies[security.SESSION_COOKIE]
        logout_form = client.get(
            "/ui",
            headers={
                "Cookie": f"{security.CSRF_COOKIE}={csrf}; {security.SESSION_COOKIE}={session}"
            },
        )
        logout = client.post(
            "/ui/logout",
            data={"csrf_token": csrf_of(logout_form.text)},
            headers={
                "Cookie": f"{security.CSRF_COOKIE}={csrf}; {security.SESSION_COOKIE}={session}"
            },
        )
        assert logout.status_code == 303
        deleted = _set_cookies(logout)[security.SESSION_COOKIE]
    assert set(cookies) == {security.CSRF_COOKIE, security.SESSION_COOKIE}
    for header in [*cookies.values(), deleted]:
        attributes = {part.strip().lower() for part in header.split(";")}
        assert "httponly" in attributes, header
        assert "samesite=strict" in attributes, header
        assert "path=/ui" in attributes, header
        assert ("secure" in attributes) is tls, header


@pytest.mark.parametrize(
    "target",
    ["https://evil.example/", "//evil.example/", "/\\evil.example", "/jobs", "javascript:alert(1)"],
)
def test_login_never_redirects_off_the_dashboard(start_app, target: str):
    api = start_app()
    with httpx.Client(base_url=api.url, timeout=30) as browser:
        form = browser.get("/ui/login", params={"next": target})
        answer = browser.post(
            "/ui/login", data={"csrf_token": csrf_of(form.text), "token": TOKEN, "next": target}
        )
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui"
