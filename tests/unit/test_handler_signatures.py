"""What a task handler is called with follows from its signature, decided when it is
registered: the payload, the job, or both. Any other signature is refused then, with an
error naming the task, not on every attempt."""

from __future__ import annotations

import functools
import types

import pytest

from pgqueue import Job, TaskHandler, ValidationError, hookimpl
from pgqueue.plugins import get_plugin_manager
from pgqueue.task_handlers import collect_tasks

JOB = types.SimpleNamespace(payload={"to": "ada@example.com"})
PAYLOAD = JOB.payload


def payload_only(payload):
    return ("payload", payload)


def job_only(job: Job):  # the seed's style
    return ("job", job)


def both(payload, job):
    return ("both", payload, job)


def keyword_only_job(payload, *, job):
    return ("both", payload, job)


def with_defaults(data, job=None, retries=3):
    return ("both", data, job)


def job_only_with_a_default(job, verbose=False):
    return ("job", job)


def star_args(*args):
    return ("payload", *args)


def star_args_and_job(*args, job):
    return ("both", *args, job)


async def async_job_only(job):
    return ("job", job)


class Mailer:
    def send(self, job):
        return ("job", job)

    def __call__(self, payload, job):
        return ("both", payload, job)


def _partial_target(prefix, payload):
    return ("payload", payload)


CALLED_WITH = {
    payload_only: ("payload", PAYLOAD),
    job_only: ("job", JOB),
    both: ("both", PAYLOAD, JOB),
    keyword_only_job: ("both", PAYLOAD, JOB),
    with_defaults: ("both", PAYLOAD, JOB),
    job_only_with_a_default: ("job", JOB),
    star_args: ("payload", PAYLOAD),
    star_args_and_job: ("both", PAYLOAD, JOB),
    Mailer().send: ("job", JOB),
    Mailer(): ("both", PAYLOAD, JOB),
    functools.partial(_partial_target, "x"): ("payload", PAYLOAD),
    len: None,  # a built-in: given the payload
}


def _name(function: object) -> str:
    """A stable test id: the same in every pytest-xdist worker (no addresses)."""
    return getattr(function, "__qualname__", None) or type(function).__name__


@pytest.mark.parametrize("function", list(CALLED_WITH), ids=_name)
def test_a_handler_is_called_with_what_its_signature_asks_for(function) -> None:
    handler = TaskHandler("send_email", function)
    expected = CALLED_WITH[function]
    result = handler.call(JOB)
    if function is len:
        assert result == len(PAYLOAD)
        assert handler.takes == "payload"
    else:
        assert result == expected
        assert (
            handler.takes
            == {"payload": "payload", "job": "job", "both": "payload, job"}[expected[0]]
        )
    assert handler.wants_job is (handler.takes != "payload")


def test_an_async_handler_that_takes_the_job_is_given_the_job() -> None:
    handler = TaskHandler("fetch", async_job_only)
    assert handler.is_async and handler.takes == "job"
    coroutine = handler.call(JOB)
    with pytest.raises(StopIteration) as stopped:
        coroutine.send(None)
    assert stopped.value.value == ("job", JOB)


def no_parameters():
    return None


def an_unknown_parameter(payload, user):
    return None


def job_and_an_unknown_parameter(job, user):
    return None


def keyword_only_payload(*, payload):
    return None


def only_keywords(**options):
    return None


@pytest.mark.parametrize(
    ("function", "problem"),
    [
        (no_parameters, "handler no_parameters() has no parameter for the payload or the job"),
        (
            an_unknown_parameter,
            "handler an_unknown_parameter(payload, user) has parameters pgqueue cannot "
            "supply: 'user'",
        ),
        (
            job_and_an_unknown_parameter,
            "handler job_and_an_unknown_parameter(job, user) has parameters pgqueue cannot "
            "supply: 'user'",
        ),
        (keyword_only_payload, "has no parameter for the payload or the job"),
        (only_keywords, "has no parameter for the payload or the job"),
    ],
)
def test_a_signature_pgqueue_cannot_call_is_refused_at_registration(function, problem) -> None:
    with pytest.raises(ValidationError) as refused:
        TaskHandler("send_email", function)
    message = str(refused.value)
    assert message.startswith("task 'send_email': ")
    assert problem in message
    assert message.endswith("a handler is def f(payload), def f(job) or def f(payload, job)")
    assert "\n" not in message


def test_a_plugins_handler_is_refused_by_register_naming_the_plugin() -> None:
    pm = get_plugin_manager(load_entrypoints=False)

    class Plugin:
        @hookimpl
        def register_tasks(self, register):
            register("send_email", an_unknown_parameter)

    pm.register(Plugin(), name="mailer")
    with pytest.raises(ValidationError, match=r"^task 'send_email' of mailer: handler "):
        collect_tasks(pm)


def test_the_worker_refuses_a_handler_it_cannot_call_before_it_runs() -> None:
    from pgqueue_worker import Worker

    with pytest.raises(ValidationError, match="has parameters pgqueue cannot supply: 'user'"):
        Worker(None, {"send_email": an_unknown_parameter})  # type: ignore[arg-type]
