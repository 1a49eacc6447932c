"""The attempts claimed ahead of a kind's slots, in the order the slots take them.

A worker claims ahead of its free slots (its prefetch), so a claim's jobs may wait in
the worker for a while. The claim statement already shares each claim between
partition keys (see ``job_claim_limited``), but it returns its jobs in priority,
``run_at`` and id order, so a small tenant's job claimed beside hundreds of a large
tenant's would wait here behind all of them. The line keeps the claim's fairness in
the worker: within the highest priority waiting, the slots take the partition keys
in turns (the jobs without a key form one lane), each key's jobs in claim order. With
no partition keys it is one lane in claim order, as a plain deque would be.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgqueue_worker.executor import Attempt


class _Level:
    """The lanes of one priority: each key's attempts, and the keys in turn order."""

    __slots__ = ("lanes", "turns")

    def __init__(self) -> None:
        self.lanes: dict[str | None, deque[Attempt]] = {}
        self.turns: deque[str | None] = deque()


class WaitingLine:
    """Attempts waiting for a slot of one kind (see the module docstring). Not
    thread-safe: the executor guards it with its lock."""

    __slots__ = ("_count", "_levels", "_top")

    def __init__(self) -> None:
        self._levels: dict[int, _Level] = {}
        self._top: int | None = None
        """The highest priority waiting (None: none waits)."""
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Attempt]:
        for level in self._levels.values():
            for lane in level.lanes.values():
                yield from lane

    def append(self, attempt: Attempt) -> None:
        """Add ``attempt`` at the end of its key's lane."""
        job = attempt.job
        priority = job.priority
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level()
            if self._top is None or priority > self._top:
                self._top = priority
        key = job.partition_key
        lane = level.lanes.get(key)
        if lane is None:
            lane = level.lanes[key] = deque()
            level.turns.append(key)
        lane.append(attempt)
        self._count += 1

    def popleft(self) -> Attempt:
        """The next attempt to run: the first of the lane whose turn it is, at the
        highest priority waiting. Raises IndexError when none waits."""
        if self._top is None:
            raise IndexError("no attempt is waiting")
        level = self._levels[self._top]
        key = level.turns.popleft()
        lane = level.lanes[key]
        attempt = lane.popleft()
        if lane:
            level.turns.append(key)  # its next job waits for the other keys' turns
        else:
            del level.lanes[key]
            if not level.lanes:
                self._drop_level(self._top)
        self._count -= 1
        return attempt

    def remove(self, attempt: Attempt) -> None:
        """Take ``attempt`` out of the line. Raises ValueError when it is not in it."""
        job = attempt.job
        level = self._levels.get(job.priority)
        lane = None if level is None else level.lanes.get(job.partition_key)
        if level is None or lane is None:
            raise ValueError("attempt is not waiting")
        lane.remove(attempt)
        if not lane:
            del level.lanes[job.partition_key]
            level.turns.remove(job.partition_key)
            if not level.lanes:
                self._drop_level(job.priority)
        self._count -= 1

    def clear(self) -> None:
        """Drop every waiting attempt."""
        self._levels.clear()
        self._top = None
        self._count = 0

    def _drop_level(self, priority: int) -> None:
        del self._levels[priority]
        if priority == self._top:
            self._top = max(self._levels) if self._levels else None
