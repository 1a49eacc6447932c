"""The plugin manager, the hookspecs and how lifecycle hooks are called."""

import inspect
import logging
import types

import pluggy
import pytest

from pgqueue import hookimpl, hookspecs
from pgqueue.lifecycle_hooks import LifecycleHooks
from pgqueue.plugins import describe_plugins, get_plugin_manager
from pgqueue.task_handlers import TaskConflict, collect_tasks

LIFECYCLE_HOOKS = ["on_start", "on_success", "on_fail", "on_dead", "on_cancel", "on_retry"]


@pytest.fixture
def pm():
    return get_plugin_manager(load_entrypoints=False)


@pytest.fixture
def bare_pm(pm):
    """The plugin manager without the built-in logging plugin, which needs real jobs."""
    pm.unregister(name="pgqueue.lifecycle_log")
    return pm


def test_every_hook_is_documented_with_typed_parameters(pm):
    for name in [*LIFECYCLE_HOOKS, "register_tasks"]:
        spec = getattr(hookspecs, name)
        assert inspect.getdoc(spec), f"{name} has no docstring"
        signature = inspect.signature(spec)
        for parameter in signature.parameters.values():
            assert parameter.annotation is not inspect.Parameter.empty, f"{name}.{parameter.name}"
        assert getattr(pm.hook, name).spec is not None


def test_installed_example_plugin_is_discovered_through_entry_points():
    pm = get_plugin_manager()
    tasks = collect_tasks(pm)
    assert {"echo", "sleep", "fail", "flaky"} <= set(tasks)
    assert tasks["echo"].source == "examples"
    info = {p.name: p for p in describe_plugins(pm)}
    assert info["examples"].version == "0.1.0"
    assert {"on_fail", "on_dead", "register_tasks"} <= set(info["examples"].hooks)


def test_misspelled_hook_fails_loudly(pm):
    plugin = types.SimpleNamespace()

    @hookimpl
    def on_daed(job):
        pass

    plugin.on_daed = on_daed
    pm.register(plugin, name="typo")
    with pytest.raises(pluggy.PluginValidationError):
        pm.check_pending()


def test_two_plugins_registering_one_task_name_is_an_error(pm):
    class First:
        @hookimpl
        def register_tasks(self, register):
            register("send", lambda payload: None)

    class Second:
        @hookimpl
        def register_tasks(self, register):
            register("send", lambda payload: None)

    pm.register(First(), name="first")
    pm.register(Second(), name="second")
    with pytest.raises(TaskConflict, match=r"first.*second|second.*first"):
        collect_tasks(pm)


def test_task_handlers_say_whether_they_are_async_and_want_the_job(pm):
    class Plugin:
        @hookimpl
        def register_tasks(self, register):
            async def fetch(payload):
                return payload

            def bump(payload, job):
                return job.attempts

            register("fetch", fetch, timeout_seconds=3)
            register("bump", bump)

    pm.register(Plugin(), name="plugin")
    tasks = collect_tasks(pm)
    assert tasks["fetch"].is_async and not tasks["fetch"].wants_job
    assert tasks["fetch"].timeout_seconds == 3
    assert tasks["bump"].wants_job and not tasks["bump"].is_async


def test_a_raising_hook_is_logged_counted_and_does_not_stop_other_plugins(bare_pm, caplog):
    pm = bare_pm
    calls = []

    class Broken:
        @hookimpl
        def on_dead(self, job):
            raise RuntimeError("hook bug")

    class Recorder:
        @hookimpl
        def on_dead(self, job):
            calls.append(job)

    pm.register(Broken(), name="broken")
    pm.register(Recorder(), name="recorder")
    hooks = LifecycleHooks(pm)
    with caplog.at_level(logging.ERROR, logger="pgqueue.plugins"):
        hooks.call("on_dead", job="the-job")
    assert calls == ["the-job"]
    assert hooks.errors["on_dead"] == 1
    assert "hook on_dead of plugin broken raised" in caplog.text


def test_hooks_receive_only_the_arguments_they_declare(bare_pm):
    pm = bare_pm
    seen = {}

    class Partial:
        @hookimpl
        def on_fail(self, job):
            seen["job"] = job

    pm.register(Partial(), name="partial")
    LifecycleHooks(pm).call("on_fail", job="j", error="boom", next_run_at=None)
    assert seen == {"job": "j"}


def test_call_each_runs_every_plugin_per_call_in_order_and_survives_a_raising_one(bare_pm):
    pm = bare_pm
    calls = []

    class First:
        @hookimpl
        def on_start(self, job):
            calls.append(("first", job))

    class Second:
        @hookimpl
        def on_start(self, job):
            if job == "b":
                raise RuntimeError("hook bug")
            calls.append(("second", job))

    pm.register(First(), name="first")
    pm.register(Second(), name="second")
    hooks = LifecycleHooks(pm)
    hooks.call_each("on_start", [{"job": "a"}, {"job": "b"}, {"job": "c"}])
    # In pluggy's order (the last registered first), as call() runs them, and each
    # job's calls before the next job's.
    assert calls == [
        ("second", "a"),
        ("first", "a"),
        ("first", "b"),
        ("second", "c"),
        ("first", "c"),
    ]
    assert hooks.errors["on_start"] == 1
