"""Every route the app serves, read from the FastAPI app itself (included routers and
mounted apps too), as concrete requests a test can send."""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from starlette.routing import Mount
from ui_support import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}
"""The header of a request with the right token."""

# A value for each path parameter that is not a Literal (those are tried one by one).
SAMPLES = {"job_id": "1", "name": "default", "path": "no-such-file.js"}


@dataclass(frozen=True)
class Endpoint:
    """One request to send: ``method`` on ``path`` (parameters filled in), and the
    route's pattern it came from."""

    method: str
    path: str
    pattern: str
    mounted: bool = False

    @property
    def dashboard(self) -> bool:
        return self.pattern == "/ui" or self.pattern.startswith("/ui/")

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def _choices(endpoint: typing.Any, name: str) -> list[str]:
    if endpoint is not None and name in inspect.signature(endpoint).parameters:
        hint = typing.get_type_hints(endpoint, include_extras=True).get(name)
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        if typing.get_origin(hint) is typing.Literal:
            return [str(value) for value in typing.get_args(hint)]
    if name not in SAMPLES:
        raise AssertionError(
            f"no sample value for the path parameter {name!r}: add one to SAMPLES so the "
            "route it belongs to is tested"
        )
    return [SAMPLES[name]]


def endpoints(app: FastAPI) -> list[Endpoint]:
    """Every route of ``app`` and every method it answers (HEAD left out: it is GET),
    one request per value of each Literal path parameter."""
    found = []
    for context in iter_route_contexts(app.routes):
        pattern = context.path_format
        assert pattern, f"a route without a path: {context.original_route!r}"
        methods = sorted((context.methods or {"GET"}) - {"HEAD"})
        if isinstance(context.original_route, Mount):
            methods = ["GET", "POST"]  # a mounted app answers whatever it likes
        paths = [pattern]
        for name in context.original_route.param_convertors:
            paths = [
                path.replace("{" + name + "}", value)
                for path in paths
                for value in _choices(context.endpoint, name)
            ]
        mounted = isinstance(context.original_route, Mount)
        found += [Endpoint(method, path, pattern, mounted) for path in paths for method in methods]
    return found
