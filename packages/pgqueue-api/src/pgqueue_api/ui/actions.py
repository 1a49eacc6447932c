"""The dashboard's state-changing actions: log in and out, cancel and retry jobs (one or
a selection), pause, resume and limit queues. Each is a POST of a form carrying the CSRF
token, answered with a redirect to the page to show next (post/redirect/get)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal, TypeGuard
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Path, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.responses import RedirectResponse, Response

from pgqueue import DependenciesFailed, InvalidTransition, Job, JobNotFound, Queue
from pgqueue_api.schemas import (
    JOB_ID_MAX,
)
from pgqueue_api.settings import ApiSettings
from pgqueue_api.ui import security
from pgqueue_api.ui.common import queue_of, render, require_session

BULK_MAX = 200
"""Jobs one bulk action may name: a page of the list holds fewer."""
NAMED_MAX = 20
"""Dependencies a refused retry names on the job's page, at most."""
JobId = Annotated[int, Path(ge=1, le=JOB_ID_MAX)]
Verb = Literal["cancel", "retry"]
DONE = {"cancel": "cancelled", "retry": "retried"}

router = APIRouter(include_in_schema=False)
protected = APIRouter(include_in_schema=False, dependencies=[Depends(require_session)])


class CsrfRefused(Exception):
    """A POST without this browser's CSRF token."""


def csrf_refused_response(request: Request, exc: Exception) -> Response:
    """403, with a page saying how to go on."""
    return render(request, "refused.html", status_code=403)


async def checked_form(request: Request) -> FormData:
    """The POSTed form, once its CSRF token is checked."""
    form = await request.form(max_files=0, max_fields=BULK_MAX + 20)
    token = form.get("csrf_token")
    if not security.csrf_valid(request, token if isinstance(token, str) else None):
        raise CsrfRefused()
    return form


def _safe_next(target: str | None) -> str:
    # Only a page of the dashboard: never an address elsewhere (an open redirect).
    if target and target.startswith("/ui") and not target.startswith("//"):
        return target
    return "/ui"


@router.get("/ui/login")
async def login_page(request: Request, next: str | None = None) -> Response:
    """The login form (with no tokens configured there is nothing to log in to)."""
    settings: ApiSettings = request.app.state.settings
    if not settings.auth_required:
        return RedirectResponse("/ui", status_code=303)
    return render(request, "login.html", next=_safe_next(next), error=None)


@router.post("/ui/login")
async def login(request: Request, form: Annotated[FormData, Depends(checked_form)]) -> Response:
    """Check the token given and open a session."""
    settings: ApiSettings = request.app.state.settings
    target = _safe_next(str(form.get("next") or ""))
    if not settings.auth_required:
        return RedirectResponse("/ui", status_code=303)
    presented = str(form.get("token") or "").strip()
    token = security.matching_token(presented, settings.tokens) if presented else None
    if token is None:
        error = "That token is not valid." if presented else "Enter an API token."
        return render(request, "login.html", status_code=401, next=target, error=error)
    response = RedirectResponse(target, status_code=303)
    security.set_session(request, response, token)
    return response


@router.post("/ui/logout")
async def logout(request: Request, form: Annotated[FormData, Depends(checked_form)]) -> Response:
    """End the session."""
    response = RedirectResponse("/ui/login", status_code=303)
    security.clear_session(request, response)
    return response


def _is_verb(value: object) -> TypeGuard[Verb]:
    return value in DONE


def _act(queue: Queue, verb: Verb) -> Callable[[int], Job]:
    return queue.cancel if verb == "cancel" else queue.retry


@protected.post("/ui/jobs/{job_id}/{verb}")
async def job_action(
    request: Request,
    job_id: JobId,
    verb: Verb,
    form: Annotated[FormData, Depends(checked_form)],
) -> Response:
    """Cancel or retry one job, then show it again."""
    outcome: dict[str, str]
    try:
        await run_in_threadpool(_act(queue_of(request), verb), job_id)
        outcome = {"done": verb}
    except DependenciesFailed as exc:
        # The page names the jobs to retry first.
        failed = ",".join(str(dependency) for dependency, _ in exc.failed[:NAMED_MAX])
        outcome = {"refused": verb, "failed": failed}
    except (InvalidTransition, JobNotFound):
        outcome = {"refused": verb}
    return RedirectResponse(f"/ui/jobs/{job_id}?{urlencode(outcome)}", status_code=303)


@protected.post("/ui/jobs")
async def bulk_action(
    request: Request, form: Annotated[FormData, Depends(checked_form)]
) -> Response:
    """Cancel or retry the selected jobs; those in a state that does not allow it are
    counted as skipped. Then back to the list as it was."""
    verb = form.get("action")
    if not _is_verb(verb):
        return Response("action must be cancel or retry", status_code=422)
    ids = []
    for value in form.getlist("job_id")[:BULK_MAX]:
        if isinstance(value, str) and value.isdigit() and 1 <= int(value) <= JOB_ID_MAX:
            ids.append(int(value))
    act = _act(queue_of(request), verb)

    def run() -> tuple[int, int]:
        done = 0
        for job_id in ids:
            try:
                act(job_id)
                done += 1
            except (InvalidTransition, JobNotFound):
                pass
        return done, len(ids) - done

    done, skipped = await run_in_threadpool(run)
    back = {
        name: field
        for name in ("queue", "task", "state", "tag", "partition_key", "contains", "after")
        if isinstance(field := form.get(name), str) and field
    }
    back.update(bulk=verb, done=str(done), skipped=str(skipped))
    return RedirectResponse(f"/ui/jobs?{urlencode(back)}", status_code=303)
