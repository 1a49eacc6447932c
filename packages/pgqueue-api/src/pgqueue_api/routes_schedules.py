"""Periodic schedules: list them, enable and disable them for every worker (see
:mod:`pgqueue.schedule_store`). Plugins declare schedules; the API only switches them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import Field, StrictBool
from starlette.concurrency import run_in_threadpool

from pgqueue import Queue
from pgqueue.schedules import ScheduleError, ScheduleInfo, ScheduleNotFound
from pgqueue_api.errors import error_response
from pgqueue_api.responses import (
    INVALID,
    UNAVAILABLE,
    ErrorResponse,
)
from pgqueue_api.routes_jobs import QueueDep, json_response
from pgqueue_api.schemas import (
    RequestBody,
    ResponseBody,
)
from pgqueue_api.strict_json import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute, tags=["schedules"])

ScheduleName = Annotated[str, Path(min_length=1, max_length=255, description="Its name.")]


class ScheduleSummary(ResponseBody):
    """One schedule."""

    name: str = Field(description="Its name, unique across plugins.")
    cron: str = Field(description="Its cron expression (5 fields, or 6 with seconds first).")
    timezone: str = Field(description="The IANA time zone its ticks are read in.")
    task: str = Field(description="The task of the jobs it enqueues.")
    queue: str = Field(description="The queue they go to.")
    payload: dict[str, Any] = Field(description="Their payload.")
    priority: int = Field(description="Their priority.")
    max_attempts: int | None = Field(description="Their attempts; null: the default.")
    source: str = Field(description="The plugin that declares it.")
    enabled: bool = Field(description="Whether workers enqueue its ticks.")
    disabled_by: str | None = Field(
        description="`operator`, or `sync` when its plugin no longer declares it; null "
        "while enabled."
    )
    removed_at: datetime | None = Field(
        description="When a worker found that its plugin no longer declares it."
    )
    next_run_at: datetime | None = Field(description="Its next tick; null while disabled.")
    last_run_at: datetime | None = Field(description="When its last job was enqueued.")
    last_tick_at: datetime | None = Field(description="The tick that job was for.")
    last_job_id: int | None = Field(description="That job's id.")
    created_at: datetime = Field(description="When a worker first wrote it.")
    updated_at: datetime = Field(description="When its definition or switch last changed.")
    error: str | None = Field(
        description="Why the scheduler skips it: a time zone, cron expression or payload "
        "of its row that the scheduler cannot read (as the last round that looked found); "
        "`next_run_at` is then when a round looks at it again. Null while it runs."
    )


class ScheduleList(ResponseBody):
    """Every schedule."""

    schedules: list[ScheduleSummary] = Field(description="By name.")


class ScheduleUpdate(RequestBody):
    """The switch."""

    enabled: StrictBool = Field(description="Enable (true) or disable (false) it.")


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No schedule has this name."}
}


def schedule_links(pointer: str) -> dict[str, dict[str, Any]]:
    """OpenAPI links from an answer holding a schedule at JSON pointer ``pointer``."""
    return {
        "SwitchSchedule": {
            "operationRef": "#/paths/~1schedules~1{name}/patch",
            "parameters": {"name": f"$response.body#{pointer}/name"},
            "description": "Enable or disable the schedule.",
        }
    }


@router.get(
    "/schedules",
    response_model=ScheduleList,
    summary="List schedules",
    responses={200: {"links": schedule_links("/schedules/0")}, **UNAVAILABLE},
)
async def list_schedules(queue: QueueDep) -> Response:
    """Every schedule the workers' plugins declared, enabled or not, with its next and
    last run."""
    found = await run_in_threadpool(queue.schedules)
    return json_response({"schedules": [info.to_dict() for info in found]})


def _switch(queue: Queue, name: str, enabled: bool) -> Response:
    try:
        info: ScheduleInfo = queue.set_schedule_enabled(name, enabled)
    except ScheduleNotFound as exc:
        return error_response(404, str(exc))
    except ScheduleError as exc:
        # The stored row's problem (a time zone or cron expression this version
        # cannot read), not the request's.
        return error_response(409, str(exc))
    return json_response(info.to_dict())


@router.patch(
    "/schedules/{name}",
    response_model=ScheduleSummary,
    summary="Enable or disable a schedule",
    responses={
        200: {"links": schedule_links("")},
        **NOT_FOUND,
        409: {
            "model": ErrorResponse,
            "description": "Its row cannot be enabled: a time zone or cron expression this "
            "version cannot read.",
        },
        **INVALID,
        **UNAVAILABLE,
    },
)
async def update_schedule(name: ScheduleName, update: ScheduleUpdate, queue: QueueDep) -> Response:
    """`{"enabled": false}` stops every worker from enqueueing it; `{"enabled": true}`
    starts it again from its next tick (no runs for the ticks it spent disabled). The
    switch holds across worker restarts and redeployments."""
    return await run_in_threadpool(_switch, queue, name, update.enabled)
