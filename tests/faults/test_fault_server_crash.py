"""Scenario 1: PostgreSQL crashes (``pg_ctl stop -m immediate``: no shutdown checkpoint,
crash recovery on the next start) while workers claim and ack and a producer enqueues.

Nothing acknowledged may be lost: every enqueue the producer was told had committed is
in the table after recovery and succeeds; every ack a worker saw commit is still there,
and no job is acked twice.
"""

from __future__ import annotations

from pathlib import Path

from fault_support import FaultRun


def test_a_crash_in_the_middle_of_claims_and_acks_loses_no_acknowledged_job(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    with FaultRun.prepared(server.url(), tmp_path) as run:
        run.start_workers(2)
        producer = run.produce(300, pause=0.03)
        run.wait_until_succeeded(60)

        in_flight = run.counts()
        server.stop("immediate")
        server.start()
        recovered_from = run.now()

        run.wait_until_done()
        verdict = run.verdict()

    # The crash hit a queue with work left: queued, and claimed but not acked.
    assert in_flight["queued"] + in_flight["running"] > 0
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 300}
    record_figures(
        "01-server-crash",
        verdict.figures(
            recovery_seconds=verdict.recovery_seconds(recovered_from),
            producer_refusals=len(producer.refusals),
        ),
    )
