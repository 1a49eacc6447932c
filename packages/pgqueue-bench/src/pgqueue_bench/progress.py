"""A live status line for long runs, shown only on a terminal."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


class LiveLine:
    """One line of status rewritten in place (at most ten times a second).

    On a terminal it redraws with a carriage return; elsewhere (CI logs, pipes) it
    stays silent except for :meth:`log`, so logs are not flooded.
    """

    def __init__(self, stream: TextIO | None = None, *, interval: float = 0.1) -> None:
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty()
        self.interval = interval
        self._last_draw = 0.0
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        """Show ``text`` as the current status."""
        if not self.interactive:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.interval:
            return
        self._last_draw = now
        columns = shutil.get_terminal_size((100, 20)).columns - 1
        line = text[:columns]
        self.stream.write("\r" + line + " " * max(0, self._width - len(line)))
        self.stream.flush()
        self._width = len(line)

    def clear(self) -> None:
        """Erase the status line."""
        if self.interactive and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def log(self, text: str) -> None:
        """Print a permanent line (above the status line on a terminal)."""
        self.clear()
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> LiveLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()
