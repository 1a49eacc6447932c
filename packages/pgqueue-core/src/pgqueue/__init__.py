"""pgqueue: a durable, at-least-once job queue whose only moving part is PostgreSQL."""

from pgqueue.async_producer import AsyncProducer
from pgqueue.backoff import backoff_seconds
from pgqueue.claiming import Waiter
from pgqueue.dependencies import (
    BatchItem,
    JobDependencies,
    JobNeighbours,
    LinkedJob,
    Workflow,
    WorkflowJob,
)
from pgqueue.errors import (
    DatabaseUnavailable,
    DependenciesFailed,
    IdempotencyConflict,
    IdempotencyMismatch,
    InvalidTransition,
    JobNotFound,
    LeaseLost,
    NoDatabaseConfigured,
    NotAnAttempt,
    PgQueueError,
    QueueNotFound,
    UniqueKeyHeld,
    UnknownDependencies,
    ValidationError,
)
from pgqueue.hookspecs import call_when, hookimpl
from pgqueue.job import EnqueueResult, Job, JobState, Lease
from pgqueue.job_spec import JobSpec
from pgqueue.lifecycle_hooks import LifecycleHooks
from pgqueue.migrations import migrate
from pgqueue.outcomes import OutcomeBatch
from pgqueue.plugins import get_plugin_manager
from pgqueue.queue import JobPage, Queue
from pgqueue.queue_control import UNSET, PartitionInfo, PartitionPage, QueueInfo
from pgqueue.queue_metrics import QueueStats
from pgqueue.registry import UnservedTask, WorkerInfo, WorkerRegistration
from pgqueue.task_handlers import TaskHandler, collect_tasks
from pgqueue.throttle import Throttle, retry_after_seconds
from pgqueue.worker_protocol import AckedClaim, WorkerProtocol

__all__ = [
    "UNSET",
    "AckedClaim",
    "AsyncProducer",
    "BatchItem",
    "DatabaseUnavailable",
    "DependenciesFailed",
    "EnqueueResult",
    "IdempotencyConflict",
    "IdempotencyMismatch",
    "InvalidTransition",
    "Job",
    "JobDependencies",
    "JobNeighbours",
    "JobNotFound",
    "JobPage",
    "JobSpec",
    "JobState",
    "Lease",
    "LeaseLost",
    "LifecycleHooks",
    "LinkedJob",
    "NoDatabaseConfigured",
    "NotAnAttempt",
    "OutcomeBatch",
    "PartitionInfo",
    "PartitionPage",
    "PgQueueError",
    "Queue",
    "QueueInfo",
    "QueueNotFound",
    "QueueStats",
    "TaskHandler",
    "Throttle",
    "UniqueKeyHeld",
    "UnknownDependencies",
    "UnservedTask",
    "ValidationError",
    "Waiter",
    "WorkerInfo",
    "WorkerProtocol",
    "WorkerRegistration",
    "Workflow",
    "WorkflowJob",
    "backoff_seconds",
    "call_when",
    "collect_tasks",
    "get_plugin_manager",
    "hookimpl",
    "migrate",
    "retry_after_seconds",
]
