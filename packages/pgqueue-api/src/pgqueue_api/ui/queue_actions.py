"""The dashboard's queue and schedule controls: pause, resume and limits
(``Queue.pause_queue``, ``resume_queue`` and ``update_queue``), and enabling and
disabling schedules (``Queue.set_schedule_enabled``), each a POST carrying the CSRF
token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.responses import RedirectResponse, Response

from pgqueue import DatabaseUnavailable, PgQueueError
from pgqueue_api.ui.actions import checked_form
from pgqueue_api.ui.common import queue_controls, queue_of, render, require_session
from pgqueue_api.ui.pages import queues_context, schedules_context

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_session)])


class BadLimit(ValueError):
    """A limit field that is not a number."""


_Limit = TypeVar("_Limit", int, float)


LIMIT_FIELDS: dict[str, Callable[[str], int | float]] = {
    "concurrency_limit": int,
    "rate_limit": float,
    "partition_concurrency_limit": int,
    "partition_rate_limit": float,
}
"""The limits form's fields, as ``update_queue`` names them, and the numbers they take."""


def _limit(form: FormData, name: str, kind: Callable[[str], _Limit]) -> _Limit | None:
    text = str(form.get(name) or "").strip()
    if not text:
        return None  # no limit
    try:
        return kind(text)
    except ValueError:
        raise BadLimit(
            f"{name.replace('_', ' ')} must be a number, or empty for no limit"
        ) from None


def _changed_limits(form: FormData) -> dict[str, Any]:
    """The limits the form changes, as ``update_queue`` takes them (None: no limit).

    The dashboard's form says what each field showed (``<name>_shown``): a field sent
    back as it was shown is left out, so the limit stays what it is now, whoever set
    it since, and a rate limit is not set again (which would empty its token bucket).
    A form without them (a script's) sets the fields it has as given; a field it
    lacks altogether stays as it is."""
    changed: dict[str, Any] = {}
    for name, kind in LIMIT_FIELDS.items():
        if name in form and _edited(form, name):
            changed[name] = _limit(form, name, kind)
    return changed


def _edited(form: FormData, name: str) -> bool:
    """False for a field sent back as the page showed it."""
    shown = form.get(f"{name}_shown")
    return shown is None or str(form.get(name) or "").strip() != str(shown).strip()


@router.post("/ui/queues/{verb}")
async def queue_action(
    request: Request,
    verb: Literal["pause", "resume", "limits"],
    form: Annotated[FormData, Depends(checked_form)],
) -> Response:
    """Pause or resume a queue, or set its limits, the partition limits among them (an
    empty field: no limit; a field left as it was shown: unchanged); then the queues
    page again, or, for a value the queue refuses, the page with the reason."""
    if not queue_controls()["pause"]:
        return Response("this pgqueue has no queue controls", status_code=404)
    name = str(form.get("queue") or "")
    store = queue_of(request)
    try:
        if verb == "limits":
            changed = _changed_limits(form)
            await run_in_threadpool(lambda: store.update_queue(name, **changed))
        else:
            act = store.pause_queue if verb == "pause" else store.resume_queue
            await run_in_threadpool(act, name)
    except DatabaseUnavailable:
        raise
    except (BadLimit, PgQueueError) as exc:
        context = await run_in_threadpool(queues_context, request)
        return render(request, "queues.html", status_code=422, error=f"{name}: {exc}", **context)
    return RedirectResponse("/ui", status_code=303)


@router.post("/ui/schedules/{verb}")
async def schedule_action(
    request: Request,
    verb: Literal["enable", "disable"],
    form: Annotated[FormData, Depends(checked_form)],
) -> Response:
    """Enable or disable a schedule (the switch holds across worker restarts); then the
    schedules page again, or the page with the reason it could not be done."""
    if not queue_controls()["schedules"]:
        return Response("this pgqueue has no schedules", status_code=404)
    name = str(form.get("name") or "")
    store = queue_of(request)
    try:
        await run_in_threadpool(store.set_schedule_enabled, name, verb == "enable")
    except DatabaseUnavailable:
        raise
    except PgQueueError as exc:
        context = await run_in_threadpool(schedules_context, store)
        return render(request, "schedules.html", status_code=422, error=str(exc), **context)
    return RedirectResponse("/ui/schedules", status_code=303)
