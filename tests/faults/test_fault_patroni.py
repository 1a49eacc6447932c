"""Scenario 11: high-availability failover managed by Patroni.

A private Patroni cluster (one etcd member, a primary and a synchronous replica,
``synchronous_mode: true``) runs real ``pgqueue worker`` processes, a producer through
:class:`pgqueue.Queue` and one through the HTTP API, all on one multi-host URL with
``target_session_attrs=read-write``. Under that load each test asks Patroni for one
event: a switchover, a failover, or the primary's postmaster killed with SIGKILL (Patroni
then restarts it in place, with crash recovery, since it still holds the leader key).

Each reports how long the cluster had no writable primary, how long from the event until
a job finished again, and what the queue lost or did twice: nothing may be lost, and no
job may be acked twice (a handler running again is at-least-once delivery, allowed).
The module skips, saying why, only where Patroni or etcd is not installed or will not
start (``apt-get install patroni etcd-server``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fault_support import FaultRun, send_via_api, serve_api
from patroni_cluster import PatroniCluster, PatroniUnavailable, PrimaryWatch, missing_programs

from pgqueue_api import ApiSettings
from pgqueue_bench.infra.binaries import Binaries

# Scenario name in results/faults.json for each event.
EVENTS = {
    "switchover": "11-patroni-switchover",
    "failover": "11-patroni-failover",
    "primary-killed": "11-patroni-primary-killed",
}
# Jobs each producer sends, two at a time with a pause: enough to keep both producing
# through the event and the seconds after it.
JOBS_PER_PRODUCER = 240
# Work must resume this soon after the event: Patroni's TTL (10 s) bounds how long a
# dead leader's key lives, and the workers' backoff adds a few seconds to it.
RESUME_BOUND_SECONDS = 30.0


@pytest.fixture(scope="module")
def patroni(postgres_binaries: Binaries) -> Iterator[PatroniCluster]:
    """One Patroni cluster for the module; each test starts once it is healthy again."""
    missing = missing_programs()
    if missing:
        pytest.skip(
            f"Patroni failover needs {', '.join(missing)} "
            "(Debian: apt-get install -y patroni etcd-server)"
        )
    cluster = PatroniCluster(postgres_binaries)
    try:
        cluster.start()
    except PatroniUnavailable as exc:
        cluster.destroy()
        pytest.skip(f"the Patroni cluster would not start: {exc}")
    except BaseException:
        cluster.destroy()
        raise
    yield cluster
    cluster.destroy()


def _database_time(wall: float) -> datetime:
    # Every server runs on this machine: its clock is the database clock.
    return datetime.fromtimestamp(wall, UTC)


@pytest.mark.parametrize("event", list(EVENTS))
def test_patroni_event_under_load_loses_no_acknowledged_job(
    patroni: PatroniCluster, event: str, record_figures, tmp_path: Path
) -> None:
    primary, replica = patroni.wait_healthy()
    schema = f"patroni_{event.replace('-', '_')}"
    settings = ApiSettings(database_url=patroni.url, schema=schema, pool_timeout=2.0)
    statuses: Counter[int] = Counter()
    with (
        FaultRun.prepared(patroni.url, tmp_path, schema=schema) as run,
        serve_api(settings) as api,
    ):
        api.event_hooks = {"response": [lambda response: statuses.update([response.status_code])]}
        workers = run.start_workers(2)
        run.produce(JOBS_PER_PRODUCER, prefix="queue", batch=2, pause=0.1)
        run.produce(JOBS_PER_PRODUCER, prefix="api", send=send_via_api(api), batch=2, pause=0.1)
        run.wait_until_succeeded(40)

        with PrimaryWatch(patroni.nodes) as watch:
            enqueued_before = len(run.acknowledged())
            producing_at_event = not all(producer.done for producer in run.producers)
            event_at = watch.now()
            if event == "switchover":
                output = patroni.switchover(replica)
            elif event == "failover":
                output = patroni.failover(replica)
            else:
                output = f"killed postmaster {patroni.kill_postmaster(primary)}"
            run.wait_until_done()
        verdict = run.verdict()
        logs = workers.logs()

    outage, _, _ = watch.outage_after(event_at)
    back_at = watch.back_at(event_at)
    primaries = watch.primaries_after(event_at)
    # The old primary keeps finishing jobs until Patroni demotes it, so "resumed" is the
    # first job finished once a primary is back (the new one, or the restarted one),
    # counted from the event.
    resumed = verdict.recovery_seconds(_database_time(back_at if back_at else event_at))
    recovery = None if resumed is None else round(resumed + (back_at or event_at) - event_at, 3)

    assert producing_at_event
    # Every enqueue a producer was told had committed ended succeeded, and no job was
    # acked twice or by an attempt other than the one the table kept.
    assert verdict.broken_promises() == {}, (output, logs[-3000:])
    assert verdict.states == {"succeeded": verdict.jobs}
    assert verdict.jobs == 2 * JOBS_PER_PRODUCER
    assert back_at is not None, f"no change of primary seen after {event}: {output}"
    if event == "primary-killed":
        assert primaries[-1] == primary
    else:
        assert primaries[-1] == replica
    assert recovery is not None and recovery <= RESUME_BOUND_SECONDS, (recovery, output)
    record_figures(
        EVENTS[event],
        verdict.figures(
            recovery_seconds=recovery,
            first_finish_after_event_seconds=verdict.recovery_seconds(_database_time(event_at)),
            seconds_without_primary=round(outage, 3),
            primary_before=primary,
            primary_after=primaries[-1],
            enqueued_before_event=enqueued_before,
            api_requests=sum(statuses.values()),
            api_503s=statuses[503],
            resume_bound_seconds=RESUME_BOUND_SECONDS,
        ),
    )
    # Patroni brings the cluster back to a primary and a synchronous replica.
    patroni.wait_healthy()
