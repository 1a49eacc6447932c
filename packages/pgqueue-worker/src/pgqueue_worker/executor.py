"""Handler slots: threads for plain functions, one event loop for ``async def`` handlers.

The claim loop hands each claimed job to :meth:`Executor.submit` and hears back
through the ``on_finished`` callback, from whichever thread ran the handler. The
executor knows nothing about leases or the database; it runs handlers and reports.

At most ``size`` handlers run at once, plain and ``async`` together. The claim loop may
submit more than that (jobs claimed ahead, see the worker's prefetch): those wait, in
claim order, and each starts as soon as a running handler finishes, without a round
through the claim loop.

A plain function cannot be interrupted from outside, so a handler that overruns its
timeout keeps its thread until it returns (its outcome is then discarded). Coroutines
can: :meth:`Executor.cancel` cancels one on the event loop. Either way it calls the
attempt off on its job (:meth:`pgqueue.Job.mark_cancelled`), so that a plain function
that checks ``job.cancelled`` can return early.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgqueue import Job, Lease, TaskHandler

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
    future: concurrent.futures.Future[Any] | None = field(default=None, repr=False)

    def call(self) -> Any:
        """Call the handler with what its signature asks for (see TaskHandler)."""
        return self.handler.call(self.job)


FinishedCallback = Callable[[Attempt, Any, BaseException | None], None]
StartedCallback = Callable[[Attempt], None]
RunningCallback = Callable[[Attempt], None]


class Executor:
    """``size`` threads for plain handlers and, started on first use, one thread running
    an asyncio event loop for coroutine handlers, with at most ``size`` handlers running
    at once. ``on_started`` hears of each attempt with a time limit as it takes a slot
    (its deadline is set then); ``on_running`` of every attempt on the thread that runs
    its handler, just before the handler is called (the event loop's thread for a
    coroutine); ``on_finished`` of every attempt as it ends.
    """

    def __init__(
        self,
        size: int,
        on_finished: FinishedCallback,
        on_started: StartedCallback | None = None,
        on_running: RunningCallback | None = None,
    ) -> None:
        self.size = size
        self._on_finished = on_finished
        self._on_started = on_started
        self._on_running = on_running
        self._lock = threading.Lock()
        self._running = 0
        self._waiting: deque[Attempt] = deque()
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

    @property
    def waiting(self) -> int:
        """Attempts submitted that no slot has started yet."""
        return len(self._waiting)

    def submit(self, attempt: Attempt) -> None:
        """Run ``attempt``'s handler in a free slot, or as soon as one frees up."""
        with self._lock:
            if self._running >= self.size:
                self._waiting.append(attempt)
                return
            self._running += 1
        self._start(attempt)

    def cancel(self, attempt: Attempt) -> None:
        """Cancel an attempt: one still waiting for a slot is reported at once as
        cancelled, a coroutine handler is cancelled, and a plain function runs on until
        it returns (its job's ``cancelled`` turns True, for it to notice)."""
        attempt.job.mark_cancelled()
        with self._lock:
            try:
                self._waiting.remove(attempt)
            except ValueError:
                waited = False
            else:
                waited = True
        if waited:
            self._report(attempt, None, asyncio.CancelledError())
        elif attempt.future is not None:
            attempt.future.cancel()

    def shutdown(self) -> None:
        """Let idle slot threads exit and stop the event loop; running handlers are not
        waited for (the worker decides how long to wait before calling this), and
        attempts still waiting for a slot are dropped."""
        with self._lock:
            self._waiting.clear()
        for _ in self._threads:
            self._inbox.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _start(self, attempt: Attempt) -> None:
        """Start ``attempt`` in a slot already counted as running."""
        self._mark_started(attempt)
        if attempt.is_async:
            loop = self._event_loop()
            attempt.future = asyncio.run_coroutine_threadsafe(self._run_coroutine(attempt), loop)
            attempt.future.add_done_callback(lambda future: self._report_future(attempt, future))
        else:
            self._inbox.put(attempt)

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

    def _next_in_freed_slot(self) -> Attempt | None:
        """A handler returned: the waiting attempt to run in its slot, if any (the slot
        stays counted as running), else None (and the slot is free)."""
        with self._lock:
            if self._waiting:
                return self._waiting.popleft()
            self._running -= 1
            return None

    # -- plain functions ----------------------------------------------------------

    def _serve(self) -> None:
        attempt = self._inbox.get()
        while attempt is not None:
            self._running_now(attempt)
            try:
                result = attempt.call()
                if inspect.isawaitable(result):
                    # A callable object whose __call__ is async: not detectable before
                    # the call, so await its coroutine on the loop from this slot.
                    result = asyncio.run_coroutine_threadsafe(
                        _awaited(result), self._event_loop()
                    ).result()
            except BaseException as exc:  # whatever a handler raises is its attempt's failure
                following = self._report(attempt, None, exc)
            else:
                following = self._report(attempt, result, None)
            # A plain function waiting for a slot runs on this thread at once: handing it
            # to an idle thread would cost a thread switch per job.
            if following is not None and not following.is_async:
                self._mark_started(following)
                attempt = following
                continue
            if following is not None:
                self._start(following)
            attempt = self._inbox.get()

    # -- coroutines ---------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
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

    async def _run_coroutine(self, attempt: Attempt) -> Any:
        self._running_now(attempt)
        return await attempt.call()

    def _report_future(self, attempt: Attempt, future: concurrent.futures.Future[Any]) -> None:
        if future.cancelled():
            following = self._report(attempt, None, asyncio.CancelledError())
        else:
            error = future.exception()
            following = self._report(attempt, None if error else future.result(), error)
        if following is not None:
            self._start(following)

    def _report(self, attempt: Attempt, result: Any, error: BaseException | None) -> Attempt | None:
        """Report ``attempt``'s end; for one that ran in a slot, return the waiting
        attempt the caller must start in that slot, if any."""
        following = None
        if attempt.started_at is not None:
            attempt.ran_for = time.monotonic() - attempt.started_at
            following = self._next_in_freed_slot()
        try:
            self._on_finished(attempt, result, error)
        except Exception:
            log.exception("could not report the outcome of job %s", attempt.job.id)
        return following


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
