"""Handler slots: threads for plain functions, one event loop for ``async def`` handlers.

The claim loop hands each claimed job to :meth:`Executor.submit` and hears back
through the ``on_finished`` callback, from whichever thread ran the handler. The
executor knows nothing about leases or the database; it runs handlers and reports.

A plain function cannot be interrupted from outside, so a handler that overruns its
timeout keeps its thread until it returns (its outcome is then discarded). Coroutines
can: :meth:`Executor.cancel` cancels one on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgqueue import Job, TaskHandler

log = logging.getLogger("pgqueue.worker")


@dataclass(eq=False)
class Attempt:
    """One claimed attempt of a job, from dispatch until the worker is done with it.

    Owned by the claim loop: only its thread reads or writes these fields.
    """

    job: Job
    handler: TaskHandler
    wants_job: bool
    is_async: bool
    timeout_seconds: float | None
    deadline: float | None
    """``time.monotonic()`` after which the attempt counts as timed out, if it has a limit."""
    returned: bool = False
    """The handler has returned (or raised): its slot is free."""
    abandoned: str | None = None
    """Why the handler's eventual outcome will be discarded (timed out, lease lost)."""
    future: concurrent.futures.Future[Any] | None = field(default=None, repr=False)

    def call(self) -> Any:
        """Call the handler with the payload (and ``job=`` when it asks for it)."""
        if self.wants_job:
            return self.handler.function(self.job.payload, job=self.job)
        return self.handler.function(self.job.payload)


FinishedCallback = Callable[[Attempt, Any, BaseException | None], None]


class Executor:
    """``size`` threads for plain handlers and, started on first use, one thread running
    an asyncio event loop for coroutine handlers.

    The caller never submits more attempts than it has free slots; the threads take
    work from one shared inbox.
    """

    def __init__(self, size: int, on_finished: FinishedCallback) -> None:
        self.size = size
        self._on_finished = on_finished
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
        """Run ``attempt``'s handler in a free slot."""
        if attempt.is_async:
            loop = self._event_loop()
            attempt.future = asyncio.run_coroutine_threadsafe(self._run_coroutine(attempt), loop)
            attempt.future.add_done_callback(lambda future: self._report_future(attempt, future))
        else:
            self._inbox.put(attempt)

    def cancel(self, attempt: Attempt) -> None:
        """Cancel a coroutine handler (a plain function runs on until it returns)."""
        if attempt.future is not None:
            attempt.future.cancel()

    def shutdown(self) -> None:
        """Let idle slot threads exit and stop the event loop; running handlers are not
        waited for (the worker decides how long to wait before calling this)."""
        for _ in self._threads:
            self._inbox.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    # -- plain functions ----------------------------------------------------------

    def _serve(self) -> None:
        while True:
            attempt = self._inbox.get()
            if attempt is None:
                return
            try:
                result = attempt.call()
                if inspect.isawaitable(result):
                    # A callable object whose __call__ is async: not detectable before
                    # the call, so await its coroutine on the loop from this slot.
                    result = asyncio.run_coroutine_threadsafe(
                        _awaited(result), self._event_loop()
                    ).result()
            except BaseException as exc:  # whatever a handler raises is its attempt's failure
                self._report(attempt, None, exc)
            else:
                self._report(attempt, result, None)

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

    @staticmethod
    async def _run_coroutine(attempt: Attempt) -> Any:
        return await attempt.call()

    def _report_future(self, attempt: Attempt, future: concurrent.futures.Future[Any]) -> None:
        if future.cancelled():
            self._report(attempt, None, asyncio.CancelledError())
            return
        error = future.exception()
        self._report(attempt, None if error else future.result(), error)

    def _report(self, attempt: Attempt, result: Any, error: BaseException | None) -> None:
        try:
            self._on_finished(attempt, result, error)
        except Exception:
            log.exception("could not report the outcome of job %s", attempt.job.id)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
