"""The cyclic garbage collector of a long-running pgqueue process (a worker, an API
server), set up once everything it needs is loaded."""

from __future__ import annotations

import gc

GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two young-generation collections (Python's default is 700, and 2,000 from 3.13)."""


def tune_garbage_collector() -> None:
    """Set up the cyclic garbage collector for a process that allocates a handful of
    short-lived objects per job or request, thousands a second.

    Everything loaded so far (modules, plugins, the application) lives as long as the
    process: frozen, it is left out of the collector's full passes, which would
    otherwise walk all of it again every few seconds and pause every thread meanwhile. A
    larger first generation makes young collections rarer (at the default, one every few
    dozen jobs); objects that survive one are still collected as before.

    Only for a process of pgqueue's own (``pgqueue worker``, ``pgqueue-api``): frozen
    objects that later become cyclic garbage are never collected, so an application
    that embeds pgqueue decides for itself.
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
