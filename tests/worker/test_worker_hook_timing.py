"""When a worker runs lifecycle hooks, and how: ``on_start`` on the handler's thread just
before the handler (not when the job is claimed, which may be long before for a job
claimed ahead), and every hook through pluggy, so wrappers and monitoring see them."""

from __future__ import annotations

import threading
from typing import Any

from polling import wait_for
from worker_support import wait_until_state

from pgqueue import Job, JobSpec, JobState, LifecycleHooks, Queue, WorkerProtocol, hookimpl
from pgqueue.plugins import get_plugin_manager


def hooked(queue: Queue, *plugins: object) -> Queue:
    """``queue``'s pool and schema, with lifecycle hooks from ``plugins`` only."""
    pm = get_plugin_manager(load_entrypoints=False)
    pm.unregister(name="pgqueue.lifecycle_log")
    for number, plugin in enumerate(plugins):
        pm.register(plugin, name=f"plugin-{number}")
    return Queue(queue.pool, schema=queue.schema, hooks=LifecycleHooks(pm))


class Events:
    """What happened, in order, with the thread it happened on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[tuple[str, int, str]] = []

    def add(self, what: str, job: Job) -> None:
        with self._lock:
            self.items.append((what, job.id, threading.current_thread().name))

    def of(self, what: str) -> list[int]:
        with self._lock:
            return [job_id for kind, job_id, _ in self.items if kind == what]


def test_on_start_fires_as_the_handler_starts_not_when_the_job_is_claimed(
    run_worker, queue: Queue
) -> None:
    events = Events()
    release = threading.Event()

    class Plugin:
        @hookimpl
        def on_start(self, job: Job) -> None:
            events.add("on_start", job)

    def gate(payload: dict[str, Any], job: Job) -> None:
        events.add("handler", job)
        if payload.get("block"):
            assert release.wait(60)

    # Short handlers first: with them the worker claims ahead of its one slot.
    warm_up = [queue.enqueue("gate", {}).job for _ in range(30)]
    run_worker({"gate": gate}, on=hooked(queue, Plugin()), concurrency=1)
    for job in warm_up:
        wait_until_state(queue, job.id, JobState.SUCCEEDED)

    blocker, *ahead = (
        result.job
        for result in queue.enqueue_many(
            [JobSpec("gate", {"block": True}, priority=1)]
            + [JobSpec("gate", {"n": n}) for n in range(3)]
        )
    )
    # All four claimed; the blocking one holds the only slot, the others wait for it
    # under their leases.
    wait_for(
        lambda: all(queue.get(job.id).state is JobState.RUNNING for job in [blocker, *ahead]),
        what="the jobs claimed ahead",
    )
    wait_for(lambda: blocker.id in events.of("handler"), what="the blocking handler")
    assert blocker.id in events.of("on_start")
    assert not set(events.of("on_start")) & {job.id for job in ahead}

    release.set()
    for job in ahead:
        wait_until_state(queue, job.id, JobState.SUCCEEDED)
    # Every on_start came just before its handler, on the handler's own thread.
    items = events.items
    assert len(items) == 2 * 34
    for (started, start_id, start_thread), (ran, run_id, run_thread) in zip(
        items[0::2], items[1::2], strict=True
    ):
        assert (started, ran) == ("on_start", "handler")
        assert start_id == run_id
        assert start_thread == run_thread == "pgqueue-slot-1"


def test_on_start_of_an_async_handler_runs_on_the_event_loop_just_before_it(
    run_worker, queue: Queue
) -> None:
    events = Events()

    class Plugin:
        @hookimpl
        def on_start(self, job: Job) -> None:
            events.add("on_start", job)

    async def fetch(payload: dict[str, Any], job: Job) -> None:
        events.add("handler", job)

    job = queue.enqueue("fetch", {}).job
    run_worker({"fetch": fetch}, on=hooked(queue, Plugin()))
    wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert events.items == [
        ("on_start", job.id, "pgqueue-async"),
        ("handler", job.id, "pgqueue-async"),
    ]


def test_queue_claim_runs_no_on_start(queue: Queue) -> None:
    events = Events()

    class Plugin:
        @hookimpl
        def on_start(self, job: Job) -> None:
            events.add("on_start", job)

    queue.enqueue("task", {})
    with_hooks = hooked(queue, Plugin())
    with_hooks_protocol = WorkerProtocol(with_hooks)
    claimed = with_hooks_protocol.claim(["default"], ["task"], 1)
    assert len(claimed) == 1
    assert events.items == []
    # A loop of one's own runs it when it starts the handler.
    with_hooks.hooks.call("on_start", job=claimed[0])
    assert events.of("on_start") == [claimed[0].id]


def test_wrappers_and_hook_call_monitoring_see_a_workers_hooks(run_worker, queue: Queue) -> None:
    events = Events()

    class Wrapper:
        @hookimpl(wrapper=True)
        def on_start(self, job: Job):
            events.add("wrapped on_start", job)
            return (yield)

        @hookimpl(wrapper=True)
        def on_success(self, job: Job):
            result = yield
            events.add("wrapped on_success", job)
            return result

    class Failing:
        @hookimpl
        def on_success(self, job: Job) -> None:
            raise RuntimeError("a plugin's bug")

    with_hooks = hooked(queue, Failing(), Wrapper())
    monitored: list[tuple[str, int]] = []
    with_hooks.hooks.pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: monitored.append((name, kwargs["job"].id)),
        lambda outcome, name, impls, kwargs: None,
    )
    jobs = [queue.enqueue("echo", {"n": n}).job for n in range(3)]
    run_worker({"echo": lambda payload: payload}, on=with_hooks)
    for job in jobs:
        wait_until_state(queue, job.id, JobState.SUCCEEDED)

    ids = sorted(job.id for job in jobs)
    wait_for(lambda: sorted(events.of("wrapped on_success")) == ids, what="every on_success")
    assert sorted(events.of("wrapped on_start")) == ids
    assert sorted(job_id for name, job_id in monitored if name == "on_start") == ids
    assert sorted(job_id for name, job_id in monitored if name == "on_success") == ids
    assert with_hooks.hooks.errors == {"on_success": 3}
