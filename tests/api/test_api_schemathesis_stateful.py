"""Sequences of requests that follow the links of /openapi.json: jobs enqueued (one or a
batch) then fetched, cancelled and retried, their queues changed, paused and resumed,
schedules switched. No step may get a 5xx or an answer its own schema does not
describe."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import schemathesis
from api_support import TOKEN
from hypothesis import HealthCheck, settings
from psycopg import sql
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from pgqueue import Queue
from pgqueue.schedules import Schedule

# Not negative_data_rejection: every call here carries the token (get_call_kwargs), which
# undoes a mutation that drops the Authorization header, and schemathesis then reports
# the request, with its other parts valid, as negative data accepted. Invalid requests
# are the subject of test_api_schemathesis.py, operation by operation.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# About two thousand requests, under a minute alone: enough for every link to be followed,
# also when a loaded machine leads the search down another path (80 scenarios were not).
SCENARIOS = 160
STEPS_PER_SCENARIO = 12

# Answers that only a step following a link can get, because the job, queue or schedule
# that an earlier answer named exists: for each linked operation, the statuses of which
# at least one must come back. A retry or cancel of an existing job answers 200 or 409
# depending on the state the scenario left it in (only a cancelled or dead job can be
# retried), which the search reaches or not by chance; either answer proves the link led
# to the job (a made-up id gets 404).
LINKED_ANSWERS = {
    ("GET", "/jobs/{job_id}"): {200},
    ("POST", "/jobs/{job_id}/cancel"): {200, 409},
    ("POST", "/jobs/{job_id}/retry"): {200, 409},
    ("PATCH", "/queues/{name}"): {200},
    ("POST", "/queues/{name}/pause"): {200},
    ("POST", "/queues/{name}/resume"): {200},
    ("PATCH", "/schedules/{name}"): {200},
}


def test_openapi_links_connect_jobs_queues_and_schedules(start_api):
    spec = start_api().client.get("/openapi.json").json()

    def links(method: str, path: str, status: str) -> dict[str, Any]:
        return spec["paths"][path][method]["responses"][status]["links"]

    created = links("post", "/jobs", "201")
    assert created["GetJob"] == {
        "operationRef": "#/paths/~1jobs~1{job_id}/get",
        "parameters": {"job_id": "$response.body#/id"},
        "description": "The job's state and dependencies.",
    }
    assert created["PauseQueue"]["parameters"] == {"name": "$response.body#/queue"}
    assert links("post", "/jobs/batch", "201")["CancelJob"]["parameters"] == {
        "job_id": "$response.body#/items/0/job/id"
    }
    assert set(links("post", "/jobs/{job_id}/cancel", "200")) >= {"RetryJob", "GetJob"}
    assert links("get", "/queues", "200")["UpdateQueue"]["parameters"] == {
        "name": "$response.body#/queues/0/queue"
    }
    assert links("get", "/schedules", "200")["SwitchSchedule"]["parameters"] == {
        "name": "$response.body#/schedules/0/name"
    }
    # Every link names an operation of this document.
    pointers = {
        "#/paths/" + path.replace("/", "~1") + "/" + method
        for path, methods in spec["paths"].items()
        for method in methods
    }
    for methods in spec["paths"].values():
        for operation in methods.values():
            for response in operation["responses"].values():
                for link in response.get("links", {}).values():
                    assert link["operationRef"] in pointers


def start_afresh(database_url: str, schema: str, queue: Queue) -> None:
    """Empty every table of ``schema`` but its migrations, restart its sequences (job ids
    start at 1 again), and declare one schedule: the state every scenario starts from.

    Hypothesis replays the choices of earlier scenarios and requires them to lead to the
    same rules; a link is followed only from a matching answer, so the same requests must
    get the same answers, which they do only from the same state. Schedules are declared
    by workers' plugins, never through the API: one is declared the way a worker does, so
    the schedule links have something to lead to."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        relations = conn.execute(
            """
            SELECT c.relname, c.relkind FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'S') AND NOT c.relispartition
              AND c.relname <> 'migrations'
            """,
            [schema],
        ).fetchall()
        tables = [sql.Identifier(schema, name) for name, kind in relations if kind != "S"]
        conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.SQL(", ").join(tables)))
        for name, kind in relations:
            if kind == "S":
                conn.execute(
                    sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(schema, name))
                )
    queue.sync_schedules(
        {"nightly-report": Schedule("nightly-report", "0 3 * * *", "report", queue="reports")},
        ["explicit"],
    )


@pytest.mark.long
def test_linked_request_sequences_get_answers_within_the_schema(
    start_api, queue: Queue, database_url: str, schema: str
):
    running = start_api(tokens=frozenset({TOKEN}))
    # Only the links the API declares: links that schemathesis infers on its own may carry
    # a request body taken from an answer, which can turn a request it generated to be
    # invalid into a valid one, and then report that the API accepted it.
    openapi = schemathesis.openapi.from_url(
        f"{running.url}/openapi.json",
        config=SchemathesisConfig.from_dict(
            {"phases": {"stateful": {"inference": {"algorithms": []}}}}
        ),
    )
    answered: set[tuple[str, str, int]] = set()

    class Workflow(openapi.as_state_machine()):
        def setup(self):
            start_afresh(database_url, schema, queue)

        def get_call_kwargs(self, case):
            return {
                "base_url": running.url,
                "headers": {"Authorization": f"Bearer {TOKEN}"},
                "timeout": 60,
            }

        def before_call(self, case):
            super().before_call(case)
            # A valid wait on a job that no worker runs holds the sequence for as long
            # as it says, up to a minute: cut to a tenth of a second here (waiting
            # itself is tested in test_api_wait.py). An invalid one stays as generated.
            wait = (case.query or {}).get("wait")
            if isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0 < wait <= 60:
                case.query["wait"] = min(wait, 0.1)

        def after_call(self, response, case):
            super().after_call(response, case)
            answered.add((case.method.upper(), case.path, response.status_code))

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(
                response, checks=CHECKS, transport_kwargs=kwargs, recorder=self.recorder
            )

    Workflow.run(
        settings=settings(
            max_examples=SCENARIOS,
            stateful_step_count=STEPS_PER_SCENARIO,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
    )

    assert not [key for key in answered if key[2] >= 500]
    missing = [
        (method, path, sorted(statuses))
        for (method, path), statuses in LINKED_ANSWERS.items()
        if not {(method, path, status) for status in statuses} & answered
    ]
    assert not missing, f"never answered: {missing}; answered: {sorted(answered)}"
