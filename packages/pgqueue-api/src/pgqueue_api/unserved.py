"""``--reject-unserved-tasks``: refuse jobs that no live worker would run.

Off by default: a job for a task no worker serves yet is usually one deployed ahead of
its workers. On, each enqueue first asks the worker registry (one short statement)
whether a live worker serves the job's task in its queue, and answers 422 naming the
task if none does, so a misspelt task name fails at the producer instead of waiting
forever.

A client does not send a 4xx again, so a 422 must be sure. The registry is unlogged: a
crash or a failover empties it, and a clean restart keeps rows that expired while the
server was down. Until every live worker has had time to write its row again,
``Queue.unserved_tasks`` names no task, and jobs are accepted (see
:meth:`pgqueue.registry.RegistryMethods.unserved_tasks`).
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
