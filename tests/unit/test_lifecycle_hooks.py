"""LifecycleHooks calls hooks through pluggy: wrappers wrap them, hook-call monitoring
sees them, and every implementation, wrappers included, is isolated from the others'
failures."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from pgqueue import Job, JobState, call_when, hookimpl
from pgqueue.lifecycle_hooks import LifecycleHooks
from pgqueue.plugins import get_plugin_manager


@pytest.fixture
def pm():
    """A plugin manager with pgqueue's hookspecs and no plugin at all."""
    pm = get_plugin_manager(load_entrypoints=False)
    pm.unregister(name="pgqueue.lifecycle_log")
    return pm


class Recorder:
    def __init__(self, calls: list, name: str) -> None:
        self.calls = calls
        self.name = name

    @hookimpl
    def on_success(self, job, result):
        self.calls.append((self.name, job, result))


def test_a_new_style_wrapper_wraps_every_call(pm) -> None:
    calls: list = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def on_success(self, job):
            calls.append(("before", job))
            results = yield
            calls.append(("after", job, results))
            return results

    pm.register(Recorder(calls, "recorder"), name="recorder")
    pm.register(Wrapper(), name="wrapper")
    hooks = LifecycleHooks(pm)
    hooks.call_each("on_success", [{"job": "a", "result": 1}, {"job": "b", "result": 2}])

    assert calls == [
        ("before", "a"),
        ("recorder", "a", 1),
        ("after", "a", []),
        ("before", "b"),
        ("recorder", "b", 2),
        ("after", "b", []),
    ]
    assert not hooks.errors


def test_an_old_style_hookwrapper_wraps_every_call(pm) -> None:
    calls: list = []

    class OldWrapper:
        @hookimpl(hookwrapper=True)
        def on_success(self, job):
            calls.append(("before", job))
            outcome = yield
            calls.append(("after", job, outcome.get_result()))

    pm.register(Recorder(calls, "recorder"), name="recorder")
    pm.register(OldWrapper(), name="old")
    hooks = LifecycleHooks(pm)
    hooks.call("on_success", job="a", result=1)

    assert calls == [("before", "a"), ("recorder", "a", 1), ("after", "a", [])]
    assert not hooks.errors


def test_hook_call_monitoring_sees_every_call_with_its_plugins(pm) -> None:
    seen: list = []
    pm.register(Recorder([], "recorder"), name="recorder")
    pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: seen.append(
            ("before", name, [i.plugin_name for i in impls], kwargs["job"])
        ),
        lambda outcome, name, impls, kwargs: seen.append(("after", name, outcome.get_result())),
    )
    hooks = LifecycleHooks(pm)
    hooks.call_each("on_success", [{"job": "a", "result": 1}, {"job": "b", "result": 2}])
    hooks.call("on_dead", job="c")  # no implementation: no call to see

    assert seen == [
        ("before", "on_success", ["recorder"], "a"),
        ("after", "on_success", []),
        ("before", "on_success", ["recorder"], "b"),
        ("after", "on_success", []),
    ]


def test_implementations_run_in_pluggys_order(pm) -> None:
    direct: list = []
    through_hooks: list = []

    def plugin(name, **opts):
        class Plugin:
            @hookimpl(**opts)
            def on_dead(self, job):
                job.append(name)

        return Plugin()

    pm.register(plugin("plain-1"), name="plain-1")
    pm.register(plugin("last", trylast=True), name="last")
    pm.register(plugin("first", tryfirst=True), name="first")
    pm.register(plugin("plain-2"), name="plain-2")

    pm.hook.on_dead(job=direct)
    LifecycleHooks(pm).call("on_dead", job=through_hooks)
    assert through_hooks == direct == ["first", "plain-2", "plain-1", "last"]


def test_a_raising_implementation_is_counted_and_the_others_and_wrappers_go_on(pm, caplog) -> None:
    calls: list = []

    class Broken:
        @hookimpl
        def on_success(self, job):
            raise RuntimeError("hook bug")

    class Wrapper:
        @hookimpl(wrapper=True)
        def on_success(self, job):
            results = yield
            calls.append(("wrapper saw", job, results))
            return results

    pm.register(Recorder(calls, "first"), name="first")
    pm.register(Broken(), name="broken")
    pm.register(Recorder(calls, "last"), name="last")
    pm.register(Wrapper(), name="wrapper")
    hooks = LifecycleHooks(pm)
    with caplog.at_level(logging.ERROR, logger="pgqueue.plugins"):
        hooks.call_each("on_success", [{"job": "a", "result": 1}, {"job": "b", "result": 2}])

    assert calls == [
        ("last", "a", 1),
        ("first", "a", 1),
        ("wrapper saw", "a", []),
        ("last", "b", 2),
        ("first", "b", 2),
        ("wrapper saw", "b", []),
    ]
    assert hooks.errors["on_success"] == 2
    assert caplog.text.count("hook on_success of plugin broken raised; ignored") == 2
    assert "RuntimeError: hook bug" in caplog.text


@pytest.mark.parametrize("fails_in", ["setup", "teardown", "no yield", "two yields"])
@pytest.mark.parametrize("style", ["wrapper", "hookwrapper"])
def test_a_failing_wrapper_is_counted_and_the_call_goes_on(pm, caplog, fails_in, style) -> None:
    calls: list = []

    class BrokenWrapper:
        @hookimpl(**{style: True})
        def on_success(self, job):
            if fails_in == "setup":
                raise RuntimeError("wrapper bug")
            if fails_in == "no yield":
                return
            result = yield
            if fails_in == "teardown":
                raise RuntimeError("wrapper bug")
            if fails_in == "two yields":
                yield
            return result

    class GoodWrapper:
        @hookimpl(wrapper=True)
        def on_success(self, job):
            results = yield
            calls.append(("outer wrapper saw", job, results))
            return results

    pm.register(Recorder(calls, "recorder"), name="recorder")
    pm.register(BrokenWrapper(), name="broken")
    pm.register(
        GoodWrapper(),
        name="good",
    )
    hooks = LifecycleHooks(pm)
    with caplog.at_level(logging.ERROR, logger="pgqueue.plugins"):
        hooks.call("on_success", job="a", result=1)
        hooks.call("on_success", job="b", result=2)

    assert calls == [
        ("recorder", "a", 1),
        ("outer wrapper saw", "a", []),
        ("recorder", "b", 2),
        ("outer wrapper saw", "b", []),
    ]
    assert hooks.errors["on_success"] == 2
    assert "hook on_success of plugin broken" in caplog.text


def test_plugins_registered_later_are_called_and_unregistered_ones_are_not(pm) -> None:
    calls: list = []
    hooks = LifecycleHooks(pm)
    hooks.call("on_success", job="a", result=1)
    pm.register(Recorder(calls, "late"), name="late")
    hooks.call("on_success", job="b", result=2)
    pm.unregister(name="late")
    hooks.call("on_success", job="c", result=3)
    assert calls == [("late", "b", 2)]


def test_with_no_implementation_the_calls_are_not_even_looked_at(pm) -> None:
    def calls():
        raise AssertionError("iterated")
        yield

    LifecycleHooks(pm).call_each("on_success", calls())


class Switched:
    """An on_success implementation called only while ``self.on`` is true."""

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.on = False

        @hookimpl
        @call_when(lambda: self.on)
        def on_success(job):
            self.calls.append(("switched", job))

        self.on_success = on_success


def test_call_when_skips_an_implementation_while_its_predicate_is_false(pm) -> None:
    calls: list = []
    switched = Switched(calls)
    pm.register(switched, name="switched")
    pm.register(Recorder(calls, "recorder"), name="recorder")
    hooks = LifecycleHooks(pm)

    hooks.call("on_success", job="a", result=1)
    switched.on = True
    hooks.call("on_success", job="b", result=2)
    switched.on = False
    hooks.call("on_success", job="c", result=3)

    assert [call for call in calls if call[0] == "switched"] == [("switched", "b")]
    assert [call[1] for call in calls if call[0] == "recorder"] == ["a", "b", "c"]
    assert not hooks.errors


def test_with_every_implementation_switched_off_the_calls_are_not_looked_at(pm) -> None:
    pm.register(Switched([]), name="switched")

    def calls():
        raise AssertionError("iterated")
        yield

    LifecycleHooks(pm).call_each("on_success", calls())


def test_a_predicate_that_raises_counts_as_yes(pm) -> None:
    calls: list = []

    def broken() -> bool:
        raise RuntimeError("predicate broke")

    class Marked:
        @hookimpl
        @call_when(broken)
        def on_success(self, job):
            calls.append(job)

    pm.register(Marked(), name="marked")
    hooks = LifecycleHooks(pm)
    hooks.call_each("on_success", [{"job": "a"}, {"job": "b"}])
    assert calls == ["a", "b"]


def test_a_plain_pluggy_call_ignores_the_mark(pm) -> None:
    calls: list = []
    pm.register(Switched(calls), name="switched")
    pm.hook.on_success(job="a", result=1)
    assert calls == [("switched", "a")]


@pytest.mark.parametrize(("level", "logged"), [(logging.INFO, True), (logging.WARNING, False)])
def test_below_info_the_job_log_is_not_even_called_for_starts_and_successes(
    caplog, level, logged
) -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    job = Job(
        id=7, queue="default", task="noop", payload={}, priority=0, state=JobState.RUNNING,
        run_at=now, attempts=1, max_attempts=5, timeout_seconds=None, lease_token=None,
        lease_expires_at=None, worker_id="w", enqueued_at=now, started_at=now,
        finished_at=now, last_error=None, errors=[], result=None, idempotency_key=None,
    )  # fmt: skip
    pm = get_plugin_manager(load_entrypoints=False)
    # Pluggy's monitoring sees every call made through it: below INFO there is none.
    called: list[str] = []
    pm.add_hookcall_monitoring(lambda name, impls, kwargs: called.append(name), lambda *args: None)
    hooks = LifecycleHooks(pm)
    with caplog.at_level(level, logger="pgqueue.jobs"):
        hooks.call("on_start", job=job)
        hooks.call_each("on_success", [{"job": job, "result": None}])
    started = [r for r in caplog.records if "started" in r.getMessage()]
    succeeded = [r for r in caplog.records if "succeeded" in r.getMessage()]
    if logged:
        assert called == ["on_start", "on_success"]
        assert (len(started), len(succeeded)) == (1, 1)
    else:
        assert called == []
        assert (started, succeeded) == ([], [])
    assert not hooks.errors
