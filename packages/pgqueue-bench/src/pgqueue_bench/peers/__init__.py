"""pgqueue, procrastinate and PgQueuer side by side (``python -m pgqueue_bench.peers``).

:mod:`~pgqueue_bench.peers.compare` drives the runs and
:mod:`~pgqueue_bench.peers.summary` sums them up, under pgqueue's Python. The scripts in
``drivers/`` (:data:`DRIVERS`) run each system: they are run by path, each under the
Python of its own system's virtualenv, where pgqueue may not be installed, so that
folder is not a package and its scripts import only each other and their own system.
"""

from __future__ import annotations

from pathlib import Path

DRIVERS = Path(__file__).resolve().parent / "drivers"
