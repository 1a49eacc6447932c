"""``--reject-unserved-tasks``: refuse jobs that no live worker would run.

Off by default: a job for a task no worker serves yet is usually one deployed ahead of
its workers. On, each enqueue first asks the worker registry (one short statement)
whether a live worker serves the job's task in its queue, and answers 422 naming the
task if none does, so a misspelt task name fails at the producer instead of waiting
forever.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgqueue import Queue, ValidationError


def refuse_unserved(queue: Queue, jobs: Sequence[tuple[str, str]], *, in_batch: bool) -> None:
    """Raise ValidationError (a 422) naming the first of ``jobs`` (queue, task) whose task
    no live worker serves in its queue."""
    unserved = set(queue.unserved_tasks(list(dict.fromkeys(jobs))))
    if not unserved:
        return
    for index, (queue_name, task) in enumerate(jobs):
        if (queue_name, task) in unserved:
            field = f"jobs[{index}].task" if in_batch else "task"
            raise ValidationError(
                field, f"no live worker serves task {task!r} in queue {queue_name!r}"
            )
