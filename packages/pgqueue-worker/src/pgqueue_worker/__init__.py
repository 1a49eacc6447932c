"""pgqueue worker: runs task handlers on jobs claimed under leases.

As a library::

    from pgqueue import Queue
    from pgqueue_worker import Worker

    with Queue.connect("postgresql://...") as queue:
        Worker(queue, {"send_email": send_email}, concurrency=8).run()

From the command line, ``pgqueue worker`` serves the handlers installed plugins
register; ``pgqueue worker --help`` lists its flags.
"""

from pgqueue_worker.handlers import as_task_handlers, merge_handlers
from pgqueue_worker.worker import (
    DEFAULT_CONCURRENCY,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REAP_INTERVAL,
    DEFAULT_SHUTDOWN_TIMEOUT,
    Worker,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_REAP_INTERVAL",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "Worker",
    "as_task_handlers",
    "merge_handlers",
]
