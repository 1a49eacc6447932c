"""Handler slots: threads for plain functions, one event loop for ``async def`` handlers.

The claim loop hands each claimed job to :meth:`Executor.submit` and hears back
through the ``on_finished`` callback, from whichever thread ran the handler. The
executor knows nothing about leases or the database; it runs handlers and reports.

The two kinds have limits of their own: at most ``size`` plain functions run at once
(one per thread), and at most ``async_size`` coroutines. A coroutine that awaits holds
no thread, so the event loop can run far more of them than there are threads, and
jobs that await drain at up to their slots over the await time (20 ms jobs in 32
slots could not pass 1,600 jobs/s). The claim loop may submit more
than a kind's limit (jobs claimed ahead, see the worker's prefetch): those wait, in
claim order but for partition keys, which take turns (see
:mod:`pgqueue_worker.waiting_line`), and each starts as soon as a running handler of its kind finishes,
without a round through the claim loop.

A plain function cannot be interrupted from outside, so a handler that overruns its
timeout keeps its thread until it returns (its outcome is then discarded). Coroutines
can: :meth:`Executor.cancel` cancels one on the event loop. Either way it calls the
attempt off on its job (:meth:`pgqueue.Job.mark_cancelled`), so that a plain function
that checks ``job.cancelled`` can return early.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgqueue import Job, Lease, TaskHandler, tracing
from pgqueue_worker.waiting_line import WaitingLine

log = logging.getLogger("pgqueue.worker")


@dataclass(eq=False)
class Attempt:
    """One claimed attempt of a job, from dispatch until the worker is done with it.

    Owned by the claim loop: only its thread writes these fields, except the ones the
    executor sets when a slot starts or finishes the handler.
    """

    job: Job
    lease: Lease
    """The job's lease as claimed: the key of every record the worker keeps of it."""
    handler: TaskHandler
    is_async: bool
    timeout_seconds: float | None
    started_at: float | None = None
    """``time.monotonic()`` when a slot started the handler (set by the executor)."""
    deadline: float | None = None
    """``time.monotonic()`` after which the attempt counts as timed out, if it has a limit
    (set by the executor when the handler starts)."""
    ran_for: float | None = None
    """Seconds the handler ran (set by the executor when it returns)."""
    returned: bool = False
    """The handler has returned (or raised): its slot is free."""
    abandoned: str | None = None
    """Why the handler's eventual outcome will be discarded (timed out, lease lost)."""
    task: asyncio.Task[Any] | None = field(default=None, repr=False)
    """The coroutine handler's task on the event loop, once the loop started it."""
    entered: bool = False
    """The coroutine handler's task has begun (set on the event loop's thread)."""

    def call(self) -> Any:
        """Call the handler with what its signature asks for (see TaskHandler), in the
        attempt's span when tracing is on (see :mod:`pgqueue.tracing`)."""
        if tracing.enabled():
            return tracing.consume(self.job, self.handler.call, self.is_async)
        return self.handler.call(self.job)


FinishedCallback = Callable[[Attempt, Any, BaseException | None], None]
StartedCallback = Callable[[Attempt], None]
RunningCallback = Callable[[Attempt], None]
ReturnedCallback = Callable[[Attempt], Callable[[], None] | None]


class Slots:
    """One kind's handler slots: how many it has, how many run, and the attempts
    submitted beyond them, waiting their turn (partition keys take turns, see
    :mod:`pgqueue_worker.waiting_line`). Guarded by the executor's lock."""

    __slots__ = ("running", "size", "waiting")

    def __init__(self, size: int) -> None:
        self.size = size
        self.running = 0
        self.waiting = WaitingLine()


class Executor:
    """``size`` threads for plain handlers and, started on first use, one thread running
    an asyncio event loop for coroutine handlers, with at most ``size`` plain handlers
    and ``async_size`` coroutine handlers running at once. ``on_started`` hears of each
    attempt with a time limit as it takes a slot (its deadline is set then);
    ``on_running`` of every attempt on the thread that runs its handler, just before
    the handler is called (the event loop's thread for a coroutine); ``on_finished`` of
    every attempt as it ends.
    """

    def __init__(
        self,
        size: int,
        on_finished: FinishedCallback,
        on_started: StartedCallback | None = None,
        on_running: RunningCallback | None = None,
        *,
        async_size: int | None = None,
        on_returned: ReturnedCallback | None = None,
    ) -> None:
        self.size = size
        self.async_size = size if async_size is None else async_size
        self._on_finished = on_finished
        self._on_started = on_started
        self._on_running = on_running
        self._on_returned = on_returned
        self._lock = threading.Lock()
        self._plain = Slots(size)
        self._async = Slots(self.async_size)
        self._inbox: queue.SimpleQueue[Attempt | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()

    def start(self) -> None:
        """Start the slot threads. They are daemons: a handler stuck forever must not
        keep the process alive after the worker gave up waiting for it."""
        for number in range(1, self.size + 1):
            thread = threading.Thread(
                target=self._serve, name=f"pgqueue-slot-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def submit(self, attempt: Attempt) -> None:
        """Run ``attempt``'s handler in a free slot of its kind, or as soon as one frees up."""
        self.submit_many([attempt])

    def submit_many(self, attempts: list[Attempt]) -> None:
        """:meth:`submit` each of ``attempts``, in order. The coroutines among them that
        have a free slot reach the event loop in one hand-over, not one each."""
        starting: list[Attempt] = []
        with self._lock:
            for attempt in attempts:
                slots = self._async if attempt.is_async else self._plain
                if slots.running >= slots.size:
                    slots.waiting.append(attempt)
                else:
                    slots.running += 1
                    starting.append(attempt)
        coroutines = []
        for attempt in starting:
            self._mark_started(attempt)
            if attempt.is_async:
                coroutines.append(attempt)
            else:
                self._inbox.put(attempt)
        if coroutines:
            self._event_loop().call_soon_threadsafe(self._spawn_all, coroutines)

    def cancel(self, attempt: Attempt) -> None:
        """Cancel an attempt: one still waiting for a slot is reported at once as
        cancelled, a coroutine handler is cancelled, and a plain function runs on until
        it returns (its job's ``cancelled`` turns True, for it to notice)."""
        attempt.job.mark_cancelled()
        slots = self._async if attempt.is_async else self._plain
        with self._lock:
            try:
                slots.waiting.remove(attempt)
            except ValueError:
                waited = False
            else:
                waited = True
        if waited:
            self._report(attempt, None, asyncio.CancelledError())
        elif attempt.is_async and self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel_task, attempt)

    def shutdown(self) -> None:
        """Let idle slot threads exit and stop the event loop; running handlers are not
        waited for (the worker decides how long to wait before calling this), and
        attempts still waiting for a slot are dropped."""
        with self._lock:
            self._plain.waiting.clear()
            self._async.waiting.clear()
        for _ in self._threads:
            self._inbox.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _mark_started(self, attempt: Attempt) -> None:
        attempt.started_at = time.monotonic()
        if attempt.timeout_seconds:
            attempt.deadline = attempt.started_at + attempt.timeout_seconds
            if self._on_started is not None:
                self._on_started(attempt)

    def _running_now(self, attempt: Attempt) -> None:
        """Tell ``on_running`` that ``attempt``'s handler is about to be called. What it
        raises is logged: it must not cost the attempt."""
        if self._on_running is not None:
            try:
                self._on_running(attempt)
            except Exception:
                log.exception("could not report the start of job %s", attempt.job.id)

    def _returned(self, attempt: Attempt) -> Callable[[], None] | None:
        """Ask ``on_returned`` what must be done, on a thread that may block, before
        ``attempt``'s outcome is reported (its last progress report written), if
        anything. What it raises is logged: it must not cost the attempt."""
        if self._on_returned is None:
            return None
        try:
            return self._on_returned(attempt)
        except Exception:
            log.exception("could not settle the end of job %s", attempt.job.id)
            return None

    @staticmethod
    def _run_returned(attempt: Attempt, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:
            log.exception("could not settle the end of job %s", attempt.job.id)

    def _next_in_freed_slot(self, slots: Slots) -> Attempt | None:
        """A handler returned: the waiting attempt of its kind to run in its slot, if
        any (the slot stays counted as running), else None (and the slot is free)."""
        with self._lock:
            if slots.waiting:
                return slots.waiting.popleft()
            slots.running -= 1
            return None

    # -- plain functions ----------------------------------------------------------

    def _serve(self) -> None:
        attempt = self._inbox.get()
        while attempt is not None:
            self._running_now(attempt)
            error: BaseException | None
            try:
                result = attempt.call()
                # None first: what most handlers return, and isawaitable's ABC check
                # costs a worker that runs thousands of jobs a second.
                if result is not None and inspect.isawaitable(result):
                    # A callable object whose __call__ is async: not detectable before
                    # the call, so await its coroutine on the loop from this slot.
                    result = asyncio.run_coroutine_threadsafe(
                        _awaited(result), self._event_loop()
                    ).result()
            except BaseException as exc:  # whatever a handler raises is its attempt's failure
                result, error = None, exc
            else:
                error = None
            work = self._returned(attempt)
            if work is not None:
                self._run_returned(attempt, work)
            following = self._report(attempt, result, error)
            # A plain function waiting for a slot runs on this thread at once: handing it
            # to an idle thread would cost a thread switch per job.
            if following is not None:
                self._mark_started(following)
                attempt = following
                continue
            attempt = self._inbox.get()

    # -- coroutines ---------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._loop_thread = threading.Thread(target=run, name="pgqueue-async", daemon=True)
                self._loop_thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def _spawn_all(self, attempts: list[Attempt]) -> None:
        """On the event loop: start a task for each attempt (already in a slot)."""
        loop = self._loop
        assert loop is not None
        for attempt in attempts:
            attempt.task = loop.create_task(self._run_coroutine(attempt))

    def _cancel_task(self, attempt: Attempt) -> None:
        """On the event loop: cancel a coroutine attempt's task. One whose task has not
        begun is left alone: it sees its job cancelled as it begins, and ends without
        calling the handler (a task cancelled before its first step would end without
        a word, and its slot would never be given back)."""
        if attempt.entered and attempt.task is not None:
            attempt.task.cancel()

    async def _run_coroutine(self, attempt: Attempt) -> None:
        """A coroutine attempt from its slot's start to its report; then the next
        waiting coroutine, if any, starts in the slot it leaves."""
        attempt.entered = True
        error: BaseException | None
        try:
            if attempt.job.cancelled:
                raise asyncio.CancelledError()
            self._running_now(attempt)
            result = await attempt.call()
        except BaseException as exc:  # whatever a handler raises is its attempt's failure
            result, error = None, exc
        else:
            error = None
        work = self._returned(attempt)
        if work is not None:
            # A statement: on a thread of its own, not on the loop the others run on.
            await asyncio.to_thread(self._run_returned, attempt, work)
        following = self._report(attempt, result, error)
        if following is not None:
            self._mark_started(following)
            self._spawn_all([following])

    def _report(self, attempt: Attempt, result: Any, error: BaseException | None) -> Attempt | None:
        """Report ``attempt``'s end; for one that ran in a slot, return the waiting
        attempt of its kind the caller must start in that slot, if any."""
        following = None
        if attempt.started_at is not None:
            attempt.ran_for = time.monotonic() - attempt.started_at
            following = self._next_in_freed_slot(self._async if attempt.is_async else self._plain)
        try:
            self._on_finished(attempt, result, error)
        except Exception:
            log.exception("could not report the outcome of job %s", attempt.job.id)
        return following


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
