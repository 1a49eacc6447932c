"""Calling the lifecycle hooks (``on_start``, ``on_success``, ``on_fail``, ...) so that
one plugin's failure never reaches another plugin, the caller, or the job."""

from __future__ import annotations

import copy
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pluggy
from pluggy import HookImpl

from pgqueue import hookspecs

# Under the plugin manager's logger: a hook's failure is a plugin's, and is filtered as one.
log = logging.getLogger("pgqueue.plugins")


@dataclass(frozen=True)
class _HookPlan:
    """What calling one hook takes, worked out once per set of implementations: their
    stand-ins (see :meth:`LifecycleHooks._isolated`), each with its
    :func:`pgqueue.call_when` predicate (None: always called). A worker calls
    ``on_start`` for every job, mostly with no implementation that wants it, so this is
    kept to a plain loop."""

    impls: list[HookImpl]
    isolated: list[HookImpl]
    conditions: tuple[tuple[HookImpl, Callable[[], object] | None], ...]
    """Each stand-in with its predicate, in pluggy's order; empty when no implementation
    has one, and every call takes them all."""

    def called_now(self) -> list[HookImpl]:
        """The stand-ins of the implementations to call now. A predicate that raises
        counts as yes: the implementation runs, and its own isolation deals with what
        is wrong."""
        if not self.conditions:
            return self.isolated
        called = []
        for stand_in, predicate in self.conditions:
            if predicate is not None:
                try:
                    if not predicate():
                        continue
                except Exception:
                    pass
            called.append(stand_in)
        return called


class LifecycleHooks:
    """Calls lifecycle hooks so that one plugin's failure never reaches another plugin,
    the caller, or the job: an exception from any implementation is logged, counted in
    ``errors``, and the call goes on without it.

    Calls go through pluggy as ``pm.hook.<name>(**kwargs)`` would: the same
    implementations in the same order, wrappers (``wrapper=True`` and old-style
    ``hookwrapper=True``) around them, and ``pm.add_hookcall_monitoring`` tracers see
    every call. A plain pluggy call stops at the first implementation that raises; so
    each implementation is run through a stand-in that catches its exceptions (see
    :meth:`_isolated`), and pluggy runs the stand-ins.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.errors: Counter[str] = Counter()
        self._errors_lock = threading.Lock()
        # Per hook: the plan for the implementations last seen. Rebuilt when a plugin
        # is registered or unregistered; a race only builds it twice.
        self._plans: dict[str, _HookPlan] = {}

    def call(self, hook_name: str, **kwargs: Any) -> None:
        """Run every implementation of ``hook_name`` with the arguments it asks for."""
        self.call_each(hook_name, (kwargs,))

    def call_each(self, hook_name: str, calls: Iterable[Mapping[str, Any]]) -> None:
        """``call(hook_name, **kwargs)`` for each of ``calls``, in order: a worker acks
        hundreds of jobs per statement, and looks up the implementations once for all
        of them. With no implementation, or none that wants to be called now (see
        :func:`pgqueue.call_when`), ``calls`` is not even iterated."""
        caller = getattr(self.pm.hook, hook_name)
        impls = caller.get_hookimpls()
        if not impls:
            return
        plan = self._plans.get(hook_name)
        if plan is None or plan.impls != impls:  # HookImpls compare by identity
            plan = self._plan(hook_name, impls)
        isolated = plan.called_now()
        if not isolated:
            return
        # The function HookCaller.__call__ runs: pluggy's multicall behind any
        # monitoring installed with add_hookcall_monitoring.
        execute = caller._hookexec
        for kwargs in calls:
            try:
                execute(hook_name, isolated, kwargs, False)
            except Exception:
                # Only what no stand-in can catch: a missing argument, a wrapper that
                # does not yield.
                self._failed(hook_name, None)

    def _plan(self, hook_name: str, impls: list[HookImpl]) -> _HookPlan:
        isolated = [self._isolated(hook_name, impl) for impl in impls]
        predicates = [getattr(impl.function, hookspecs.CALL_WHEN_ATTRIBUTE, None) for impl in impls]
        conditional = any(predicate is not None for predicate in predicates)
        plan = _HookPlan(
            impls=impls,
            isolated=isolated,
            conditions=tuple(zip(isolated, predicates, strict=True)) if conditional else (),
        )
        self._plans[hook_name] = plan
        return plan

    def _isolated(self, hook_name: str, impl: HookImpl) -> HookImpl:
        """A copy of ``impl`` (same plugin, options and argument names, so pluggy
        orders, calls and reports it as the original) whose function contains the
        original's exceptions."""
        stand_in = copy.copy(impl)
        function = impl.function
        if not (impl.wrapper or impl.hookwrapper):

            @functools.wraps(function)  # tracers see the original's name
            def call_isolated(*args: Any, **kwargs: Any) -> Any:
                try:
                    return function(*args, **kwargs)
                except Exception:
                    self._failed(hook_name, impl)
                    return None

            stand_in.function = call_isolated  # type: ignore[misc]
            return stand_in

        @functools.wraps(function)
        def wrap_isolated(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
            # A wrapper is a generator: its code before the yield runs before the
            # implementations, its code after once they are done. Either part may
            # raise; then the wrapper is left out and the call goes on with the result
            # it was handed (for an old-style wrapper pluggy ignores what this returns).
            try:
                # pluggy types an implementation's result as object; a wrapper's is
                # the generator its function returns.
                teardown = cast(Generator[None, Any, Any], function(*args, **kwargs))
                next(teardown)
            except Exception:  # StopIteration too: a wrapper must yield once
                self._failed(hook_name, impl)
                return (yield)
            try:
                sent = yield
            except BaseException as exc:
                # Pluggy throws in what escaped the implementations; the stand-ins let
                # only BaseExceptions (KeyboardInterrupt, ...) escape. Hand it on.
                try:
                    teardown.throw(exc)
                except StopIteration as stop:
                    return stop.value
                teardown.close()
                raise
            try:
                teardown.send(sent)
            except StopIteration as stop:
                return stop.value if impl.wrapper else sent
            except Exception:
                self._failed(hook_name, impl)
                return sent
            teardown.close()
            self._failed(hook_name, impl, "yielded twice")
            return sent

        stand_in.function = wrap_isolated  # type: ignore[misc]
        return stand_in

    def _failed(self, hook_name: str, impl: HookImpl | None, problem: str = "raised") -> None:
        """Count and log the exception being handled (or ``problem``)."""
        with self._errors_lock:
            self.errors[hook_name] += 1
        where = f" of plugin {impl.plugin_name}" if impl is not None else ""
        log.error(
            "hook %s%s %s; ignored",
            hook_name,
            where,
            problem,
            exc_info=problem == "raised",
        )
