"""Request bodies parsed as strict JSON (RFC 8259), so bad input is a 422, not a surprise.

Python's ``json`` module is lenient where PostgreSQL's jsonb is not: it accepts ``NaN``
and ``Infinity``, turns ``1e999`` into infinity, and keeps lone UTF-16 surrogates
(``"\\ud800"``) in strings, none of which jsonb or UTF-8 can store. Here each of those,
and bodies that are not UTF-8, too deeply nested or with numbers too long to convert,
is a malformed-JSON error, which FastAPI answers with 422.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from fastapi import Request, Response
from fastapi.routing import APIRoute

from pgqueue import jsonb


class _NotJSON(ValueError):
    pass


def parse_strict_json(body: bytes) -> Any:
    """Parse ``body`` as strict JSON; raises :class:`json.JSONDecodeError` if it is not."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError("the body is not valid UTF-8", "", exc.start) from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError:
        raise
    except _NotJSON as exc:
        raise json.JSONDecodeError(str(exc), text, 0) from None
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise json.JSONDecodeError(str(exc), text, 0) from None
    if jsonb.SURROGATE_ESCAPE.search(text) and jsonb.has_lone_surrogate(value):
        raise json.JSONDecodeError("a string holds a lone UTF-16 surrogate", text, 0)
    return value


def _refuse_constant(name: str) -> NoReturn:
    raise _NotJSON(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJSON(f"{text} is out of range for a JSON number")
    return value


class StrictJSONRequest(Request):
    """A request whose ``json()`` is :func:`parse_strict_json`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_strict_json(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An APIRoute that parses JSON bodies strictly."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
