"""Scenario 7: a worker stalled past its lease, and a reaper racing a late ack.

A worker process is frozen with SIGSTOP while it holds jobs, past their lease; another
worker's reaper takes the jobs back and runs them; then the frozen worker is continued
and tries to write what its handlers did. The fencing token decides: its outcomes are
discarded and exactly one outcome per job is written.

The race itself, many times over: leases that have just expired are acked by two
"late" workers while a reaper reaps them, all at once. For each job exactly one side
wins, and the loser is told so.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace
from pathlib import Path

import fault_sql
from fault_support import SCHEMA, FaultRun, prepare_schema, work_jobs
from polling import wait_for

from pgqueue import JobState, LeaseLost, Queue, WorkerProtocol
from pgqueue_bench.verdict import audit


def test_a_worker_stalled_past_its_lease_cannot_overwrite_the_rescuers_outcome(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    with FaultRun.prepared(server.url(), tmp_path) as run:
        stalled = run.start_workers(1, name="stalled", lease_seconds=1.5, heartbeat_seconds=0.3)
        rescuer = run.start_workers(1, name="rescuer", lease_seconds=1.5, heartbeat_seconds=0.3)
        run.produce(150, ms=[50, 150])
        pid = stalled.processes[0].pid

        def freeze_holding_jobs() -> list[int]:
            os.kill(pid, signal.SIGSTOP)
            held = run.held_by_cut_off(pid)
            if not held:
                os.kill(pid, signal.SIGCONT)  # caught between jobs: try again
            return held

        held = wait_for(freeze_holding_jobs, what="the worker to be frozen holding jobs")
        stopped_at = run.now()
        wait_for(
            lambda: all(run.queue.get(job_id).state is JobState.SUCCEEDED for job_id in held),
            what="the rescuer to run the frozen worker's jobs",
        )
        os.kill(pid, signal.SIGCONT)
        continued_at = run.now()

        run.wait_until_done()
        # Held jobs whose handler ran in the frozen worker (one frozen before it read its
        # claim's answer never had the job in hand): every such outcome is refused.
        wait_for(
            lambda: run.handled_by(pid) & set(held) <= stalled.discarded_outcomes(),
            what="the frozen worker's late outcomes to be discarded",
        )
        late = run.handled_by(pid) & set(held)
        verdict = run.verdict()
        rescued = [run.queue.get(job_id) for job_id in held]

    rescuer_pid = rescuer.processes[0].pid
    for job in rescued:
        assert job.attempts >= 2, job
        assert job.result["pid"] == rescuer_pid, job
        assert job.last_error is None, job  # cleared by the success
        assert any(e["error"].startswith("lease expired") for e in job.errors), job
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 150}
    record_figures(
        "07-stalled-worker",
        verdict.figures(
            jobs_held_while_frozen=len(held),
            frozen_seconds=round((continued_at - stopped_at).total_seconds(), 3),
            late_outcomes_discarded=len(late),
        ),
    )


RACE_JOBS = 40


def _race_once(queue: Queue, url: str) -> tuple[set[int], set[int], set[int]]:
    """Claim RACE_JOBS jobs, expire their leases, then ack them from two threads while a
    third reaps. Returns the ids each side won, and the ids whose ack was refused."""
    # A queue of the round's own: the jobs an earlier round's reaper put back are
    # runnable again after their short backoff, and would compete for this claim.
    protocol = WorkerProtocol(queue)
    name = f"race-{os.urandom(4).hex()}"
    specs = [replace(spec, queue=name) for spec in work_jobs(RACE_JOBS, name)]
    ids = [result.job.id for result in queue.enqueue_many(specs)]
    jobs = protocol.claim([name], ["fault_work"], RACE_JOBS, lease_seconds=60)
    assert sorted(job.id for job in jobs) == sorted(ids)
    fault_sql.run(url, "job_expire_lease", {"ids": ids}, schema=SCHEMA)

    acked: set[int] = set()
    refused: set[int] = set()
    reaped: set[int] = set()
    start = threading.Barrier(3)

    def ack(share: list) -> None:
        protocol = WorkerProtocol(queue)
        start.wait()
        for job in share:
            try:
                protocol.ack(job, {"by": "late worker"})
                acked.add(job.id)
            except LeaseLost:
                refused.add(job.id)

    def reap() -> None:
        protocol = WorkerProtocol(queue)
        start.wait()
        while True:
            batch = protocol.reap(limit=3)
            if batch is None:
                continue  # the other reaper call of this round still holds the lock
            if not batch:
                return
            reaped.update(job.id for job in batch)

    threads = [
        threading.Thread(target=ack, args=(jobs[0::2],)),
        threading.Thread(target=ack, args=(jobs[1::2][::-1],)),
        threading.Thread(target=reap),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return acked, reaped, refused


def test_a_reaper_and_late_acks_racing_for_the_same_leases_write_one_outcome_each(
    start_server, record_figures
) -> None:
    server = start_server()
    url = server.url()
    prepare_schema(url)
    acks_won = reaper_won = rounds = 0
    with Queue.connect(url, schema=SCHEMA, max_size=4) as queue:
        # Round after round until each side has won some of the races.
        while rounds < 3 or (rounds < 50 and not (acks_won and reaper_won)):
            acked, reaped, refused = _race_once(queue, url)
            rounds += 1
            assert not acked & reaped, "a job both acked and reaped"
            assert refused == reaped, "every ack that lost was refused, and only those"
            assert len(acked) + len(reaped) == RACE_JOBS
            acks_won += len(acked)
            reaper_won += len(reaped)
        transitions = audit.transitions(url, SCHEMA)

    assert acks_won and reaper_won, (acks_won, reaper_won)
    # One transition out of running per claimed job, whichever side made it.
    out_of_running = [row["job_id"] for row in transitions if row["from_state"] == "running"]
    assert len(out_of_running) == len(set(out_of_running)) == rounds * RACE_JOBS
    record_figures(
        "07-reaper-ack-race",
        {
            "jobs": rounds * RACE_JOBS,
            "lost": 0,
            "duplicates": len(out_of_running) - len(set(out_of_running)),
            "rounds": rounds,
            "acks_won": acks_won,
            "reaper_won": reaper_won,
        },
    )
