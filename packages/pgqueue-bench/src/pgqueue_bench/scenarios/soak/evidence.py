"""What a soak left behind, read once the queue has drained and the workers stopped,
and the verdict's at-least-once items.

The judgement is :func:`pgqueue_bench.verdict.audit.judge`, the one the fault scenarios use:
the audit trail and the jobs table against every enqueue a producer was told had
committed, and the acks the workers logged. For the soak, "lost" is an acknowledged
job the database no longer knows (neither in its tables nor pruned by the retention);
one it knows but that did not finish while the queue drained is counted apart. The
schedule's jobs are the only ones no producer enqueued: any other unacknowledged job
is a job that appeared from nowhere.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from pgqueue import Queue
from pgqueue_bench.infra.fleet import WorkerFleet
from pgqueue_bench.scenarios.soak.tasks import SCHEDULE_QUEUE
from pgqueue_bench.scenarios.soak.workload import Workload
from pgqueue_bench.verdict import audit, deliveries, observe

SHOWN = 10
"""Evidence listed per failed item, at most (the counts say how many there are)."""


def _item(name: str, found: list[Any], bound: str = "= 0") -> dict[str, Any]:
    return {
        "name": name,
        "value": len(found),
        "bound": bound,
        "passed": not found,
        "detail": found[:SHOWN] or None,
    }


def collect_evidence(
    url: str,
    schema: str,
    queue: Queue,
    run_dir: Path,
    fleets: list[WorkerFleet],
    workload: Workload,
) -> dict[str, Any]:
    """Judge the drained run: ``figures`` for the results, ``items`` for the verdict."""
    jobs = observe.all_jobs(queue)
    trail = audit.transitions(url, schema)
    logged = deliveries.worker_acks([path for fleet in fleets for path in fleet.log_paths.values()])
    acknowledged = workload.acknowledged
    judged = audit.judge(
        acknowledged,
        {job.id: job.state.value for job in jobs},
        trail,
        logged,
        wanted=audit.FINISHED,
    )
    final = judged.final_states
    missing = [key for key, job_id in acknowledged.items() if job_id not in final]
    unfinished = [
        f"{key} ({final[job_id]})"
        for key, job_id in acknowledged.items()
        if job_id in final and final[job_id] not in audit.FINISHED
    ]
    queue_of = {row["job_id"]: row["queue"] for row in trail} | {job.id: job.queue for job in jobs}
    ticks = [job_id for job_id in judged.unacknowledged if queue_of.get(job_id) == SCHEDULE_QUEUE]
    from_nowhere = sorted(set(judged.unacknowledged) - set(ticks))
    runs = deliveries.read_invocations(run_dir)
    evidence_missing = [] if (runs and logged) or not judged.acks_written else ["no worker logs"]
    outcomes = Counter(final[job_id] for job_id in acknowledged.values() if job_id in final)
    figures = {
        "acknowledged_enqueues": len(acknowledged),
        "outcomes": dict(outcomes),
        "lost": len(missing),
        "unfinished_after_drain": len(unfinished),
        "completed_twice": judged.completed_twice,
        "acks_committed": judged.acks_written,
        "acks_logged_by_workers": len(logged),
        "handler_runs": len(runs),
        "redeliveries": len(runs) - len({job_id for job_id, *_ in runs}),
        "failed_attempts": judged.failed_attempts,
        "pruned_by_retention": judged.pruned,
        "schedule_ticks": len(ticks),
        "audit_rows": len(trail),
    }
    items = [
        _item("lost", missing),
        _item("completed_twice", judged.double_acks + judged.contradicted_acks),
        _item("unfinished_after_drain", unfinished),
        _item("jobs_nobody_enqueued", from_nowhere),
        _item("worker_evidence", evidence_missing),
    ]
    return {"figures": figures, "items": items}
