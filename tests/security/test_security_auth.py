"""Authentication of every route the app serves, enumerated from the app itself: a route
added later without a guard fails here. Tokens are compared in constant time."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable

import httpx
import pytest
from api_support import RunningApi
from surfaces import AUTH, Endpoint, endpoints
from ui_support import TOKEN, csrf_of, logged_in_client

from pgqueue_api import auth
from pgqueue_api.ui import security

# The routes served without a token on purpose, each with the reason. Everything else
# the app serves must refuse a request without a valid token (or, under /ui, session).
PUBLIC = {
    "/healthz": "probed by load balancers; says only whether the database answers",
    "/openapi.json": "describes the routes, holds no data",
    "/docs": "Swagger UI's page; every call it makes sends the bearer token",
    "/docs/oauth2-redirect": "part of Swagger UI, static",
    "/docs/assets/{path}": "Swagger UI's files shipped in the package",
    "/ui/static/{path}": "the dashboard's CSS and vendored htmx",
    "/ui/login": "the login form and its POST, where a token is given",
    "/ui/logout": "ends this browser's session (it is still CSRF-checked)",
}
PUBLIC_WITH_PUBLIC_METRICS = {"/metrics": "--public-metrics says so"}

WRONG_TOKENS = [
    "nope",
    TOKEN[:-1],  # a prefix of the right one
    TOKEN + "x",  # longer than it
    TOKEN[:-1] + chr(ord(TOKEN[-1]) ^ 1),  # same length, last character differs
    TOKEN.upper(),
]


def _send(client: httpx.Client, endpoint: Endpoint, **kwargs) -> httpx.Response:
    # A body that would be accepted, so that only the credentials are wrong.
    body = {"json": {"task": "echo"}} if endpoint.method in ("POST", "PATCH") else {}
    return client.request(endpoint.method, endpoint.path, **body, **kwargs)


def _assert_api_refused(answer: httpx.Response, endpoint: Endpoint, invalid: bool) -> None:
    assert answer.status_code == 401, f"{endpoint}: {answer.status_code} {answer.text[:200]}"
    challenge = answer.headers["www-authenticate"]
    assert challenge.startswith("Bearer"), endpoint
    assert ('error="invalid_token"' in challenge) is invalid, endpoint


def _assert_dashboard_refused(answer: httpx.Response, endpoint: Endpoint) -> None:
    # Pages (and forms posted) go to the login page; fragments, polled by a page that
    # is still open, answer 401 and tell htmx where to go.
    if "/fragments/" in endpoint.path:
        assert answer.status_code == 401, f"{endpoint}: {answer.status_code}"
        assert answer.headers["hx-redirect"].startswith("/ui/login"), endpoint
    else:
        assert answer.status_code == 303, f"{endpoint}: {answer.status_code}"
        assert answer.headers["location"].startswith("/ui/login?next="), endpoint


def _check_every_route(api: RunningApi, public: dict[str, str]) -> list[Endpoint]:
    served = endpoints(api.app)
    patterns = {endpoint.pattern for endpoint in served}
    # The list of exceptions names only routes that exist (no stale entries).
    assert set(public) <= patterns, set(public) - patterns
    guarded = [endpoint for endpoint in served if endpoint.pattern not in public]
    forged_headers = {"Authorization": "Bearer nope"}
    with (
        httpx.Client(base_url=api.url, timeout=60) as anonymous,
        httpx.Client(base_url=api.url, timeout=60, headers=forged_headers) as forger,
    ):
        # A CSRF token valid for this anonymous browser: a refused POST is refused for
        # want of a session, not of the CSRF token.
        csrf = csrf_of(anonymous.get("/ui/login").text)
        forger.cookies.set(security.CSRF_COOKIE, anonymous.cookies[security.CSRF_COOKIE])
        forger.cookies.set(security.SESSION_COOKIE, "9999999999.nonce.0123abcd")
        for endpoint in guarded:
            if endpoint.dashboard:
                data = {"data": {"csrf_token": csrf}} if endpoint.method == "POST" else {}
                answer = anonymous.request(endpoint.method, endpoint.path, **data)
                _assert_dashboard_refused(answer, endpoint)
                # A made-up session and a wrong bearer token are no better.
                forged = forger.request(endpoint.method, endpoint.path, **data)
                _assert_dashboard_refused(forged, endpoint)
            else:
                _assert_api_refused(_send(anonymous, endpoint), endpoint, invalid=False)
                for wrong in WRONG_TOKENS:
                    answer = _send(
                        anonymous, endpoint, headers={"Authorization": f"Bearer {wrong}"}
                    )
                    _assert_api_refused(answer, endpoint, invalid=True)
                # With the right token the guard lets it through.
                assert _send(anonymous, endpoint, headers=AUTH).status_code != 401, endpoint
    for endpoint in served:
        if endpoint.pattern not in public:
            continue
        with httpx.Client(base_url=api.url, timeout=60) as browser:
            # (The login form wants a token: the one it is given is right.)
            form = {"csrf_token": csrf_of(browser.get("/ui/login").text), "token": TOKEN}
            data = {"data": form} if endpoint.dashboard else {}
            answer = browser.request(endpoint.method, endpoint.path, **data)
            assert answer.status_code not in (401, 403), f"{endpoint} is meant to be public"
    return guarded


def test_every_route_refuses_a_missing_or_wrong_token(start_app: Callable[..., RunningApi]):
    api = start_app()
    guarded = _check_every_route(api, PUBLIC)
    # The enumeration found the routes (not an empty loop that passes).
    assert {"/jobs", "/queues/{name}", "/metrics", "/ui", "/ui/jobs/{job_id}/{verb}"} <= {
        endpoint.pattern for endpoint in guarded
    }
    assert len(guarded) >= 30
    # Logged in, the dashboard's pages answer.
    with logged_in_client(api.url) as browser:
        for endpoint in guarded:
            if endpoint.dashboard and endpoint.method == "GET":
                answer = browser.get(endpoint.path)
                assert answer.status_code in (200, 404), f"{endpoint}: {answer.status_code}"


def test_public_metrics_opens_metrics_and_nothing_else(start_app: Callable[..., RunningApi]):
    api = start_app(public_metrics=True)
    _check_every_route(api, {**PUBLIC, **PUBLIC_WITH_PUBLIC_METRICS})


def test_unknown_paths_are_refused_before_they_are_looked_up(start_app):
    client = start_app().client
    for path in ("/no-such-route", "/jobs/1/no-such-verb", "/.env", "/metrics/../jobs"):
        assert client.get(path).status_code == 401, path
    # Under /ui, an unknown page needs a session first, then is not found.
    assert client.get("/ui/no-such-page").status_code in (303, 401, 404)


@pytest.mark.parametrize(
    "value",
    [
        b"Bearer \xff\xfe",  # not text
        b"Bearer " + "\u00e9".encode("latin-1"),
        b"Bearer " + b"x" * 10_000,
        b"Bearer",
        b"Basic " + TOKEN.encode(),
        TOKEN.encode(),
    ],
)
def test_malformed_authorization_headers_are_401_not_500(start_app, value: bytes):
    client = start_app().client
    answer = client.get("/jobs", headers=[(b"Authorization", value)])
    assert answer.status_code == 401


def test_a_token_that_is_not_ascii_logs_in_to_nothing(start_app):
    api = start_app()
    with httpx.Client(base_url=api.url, timeout=30) as browser:
        form = browser.get("/ui/login")
        answer = browser.post(
            "/ui/login",
            data={"csrf_token": csrf_of(form.text), "token": "\u00e9\ud7ff\x00", "next": "/ui"},
        )
        assert answer.status_code == 401
        assert security.SESSION_COOKIE not in browser.cookies


# The functions that compare a presented secret with a configured one.
SECRET_COMPARISONS = [
    auth.BearerAuthMiddleware._known,
    security.matching_token,
    security.valid_session,
    security.csrf_valid,
]
SECRET_NAMES = {"presented", "token", "tokens", "signature", "secret", "value", "self"}


@pytest.mark.parametrize("function", SECRET_COMPARISONS, ids=lambda f: f.__qualname__)
def test_secrets_are_compared_in_constant_time(function):
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = [
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    assert "compare_digest" in calls, f"{function.__qualname__} does not use compare_digest"
    # No ==, !=, in or startswith on a secret: those stop at the first difference.
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            operands = [node.left, *node.comparators]
            names = {n.id for o in operands for n in ast.walk(o) if isinstance(n, ast.Name)}
            calls_on = {
                n.func.attr
                for o in operands
                for n in ast.walk(o)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            }
            # value.count(".") != 2 looks at the cookie's shape, not at a secret.
            if calls_on == {"count"}:
                continue
            assert not names & SECRET_NAMES, (
                f"{function.__qualname__} compares a secret with {ast.unparse(node)!r}"
            )
    # Every configured token is compared, whatever matched: no early return in the loop.
    for node in ast.walk(tree):
        if isinstance(node, ast.For):
            assert not any(isinstance(n, (ast.Return, ast.Break)) for n in ast.walk(node)), (
                f"{function.__qualname__} stops comparing at the first match"
            )


def test_the_middleware_checks_tokens_with_its_constant_time_comparison():
    # Behaviour of the very function the source check read: any configured token, and
    # nothing that differs from one of them however little.
    middleware = auth.BearerAuthMiddleware(None, tokens=[TOKEN, "second"], public_paths=())
    assert middleware._known(TOKEN.encode())
    assert middleware._known(b"second")
    for wrong in WRONG_TOKENS:
        assert not middleware._known(wrong.encode())
    assert security.matching_token("second", [TOKEN, "second"]) == "second"
    assert security.matching_token(TOKEN[:-1], [TOKEN, "second"]) is None
