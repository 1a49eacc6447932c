"""Scenario 4: the network between a worker (and the API) and PostgreSQL fails.

Blackhole: a TCP proxy the test controls sits in front of the private server. One worker
and the API reach the database only through it; another worker connects directly. The
proxy blackholes the path for longer than a lease: the cut-off worker's statements hang,
its heartbeats stop, and the direct worker's reaper takes its jobs back and runs them; a
new connection through the proxy is never answered, so the API's health check gives up
on its connect timeout and answers 503. Then the path resets (every connection gets an
RST, as from a firewall that lost its state): the cut-off worker's late outcomes are
refused by the fencing token, it reconnects and goes back to work, and the API answers
again. No job is completed twice.

Pulled cable: a proxy's own kernel answers keepalive probes, so only a path that drops
packets shows TCP's timers at work. A worker in a network namespace of its own reaches
PostgreSQL over that namespace's loopback, which the test brings down: its connections,
idle or with a statement in flight, must be ended by keepalives and TCP_USER_TIMEOUT
while the cable is still out, and it must get back to work once it is plugged in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fault_support import SCHEMA, FaultRun, send_via_api, serve_api
from polling import wait_for

from pgqueue import JobState
from pgqueue_api import ApiSettings
from pgqueue_bench.infra import netns
from pgqueue_bench.infra.proxy import FaultProxy
from pgqueue_bench.infra.servers import LOOPBACK, SUPERUSER


def _cut_while_holding(
    run: FaultRun, pid: int, cut: Callable[[], None], heal: Callable[[], None]
) -> list[int]:
    """Cut worker ``pid`` off at a moment it holds jobs; return their ids (read once it
    is cut off, so they cannot change)."""

    def attempt() -> list[int]:
        # Cut only while the database says it holds jobs: cutting at random, then healing
        # and cutting again, would keep its connections in TCP retransmission backoff
        # while the other worker drains the queue.
        wait_for(lambda: run.claimed_by(pid), what="the worker to hold jobs")
        cut()
        held = run.held_by_cut_off(pid)
        if not held:
            heal()  # caught between two jobs: try again
        return held

    return wait_for(attempt, what="the worker to be cut off while it holds jobs")


def test_a_blackholed_worker_is_fenced_out_then_recovers_when_the_path_resets(
    start_server, record_figures, tmp_path: Path
) -> None:
    server = start_server()
    with FaultProxy(server.port) as proxy, FaultRun.prepared(server.url(), tmp_path) as run:
        through_proxy = f"postgresql://{SUPERUSER}@{LOOPBACK}:{proxy.port}/postgres"
        settings = ApiSettings(database_url=through_proxy, schema=SCHEMA, pool_timeout=2.0)
        with serve_api(settings) as api:
            cut_off = run.start_workers(
                1, url=through_proxy, name="cut-off", lease_seconds=1.5, heartbeat_seconds=0.3
            )
            direct = run.start_workers(1, name="direct", lease_seconds=1.5, heartbeat_seconds=0.3)
            run.produce(400, ms=[50, 150])
            pid = cut_off.processes[0].pid
            held = _cut_while_holding(run, pid, proxy.blackhole, proxy.forward)
            blackholed_at = run.now()
            unanswered = api.get("/healthz", timeout=30)
            wait_for(
                lambda: all(run.queue.get(job_id).state is JobState.SUCCEEDED for job_id in held),
                what="the direct worker to run the cut-off worker's jobs",
            )
            # From here on only the cut-off worker can finish the work.
            assert direct.stop() == [0]
            reset = proxy.reset()
            reset_at = run.now()

            # Back at work: the cut-off worker completes jobs again, and the API answers.
            after = run.produce(60, send=send_via_api(api), prefix="after")
            wait_for(
                lambda: [
                    job_id
                    for job_id in run.claimed_by(pid, "succeeded")
                    if run.queue.get(job_id).finished_at > reset_at
                ],
                what="the cut-off worker to complete a job after the reset",
            )
            run.wait_until_done()
            healthy = api.get("/healthz")
            verdict = run.verdict()
            rescued = [run.queue.get(job_id) for job_id in held]
            logs = cut_off.logs()
            # Held jobs whose handler had run there (a claim whose answer was still on
            # the cut path never reached a handler): their outcomes must be refused.
            late = run.handled_by(pid) & set(held)
            discarded = cut_off.discarded_outcomes()

    direct_pid = direct.processes[0].pid
    assert held and reset >= 1
    assert unanswered.status_code == 503
    assert healthy.status_code == 200
    assert len(after.acknowledged) == 60
    for job in rescued:
        assert job.result["pid"] == direct_pid, job
        assert job.last_error is None, job  # cleared by the success
        assert any(e["error"].startswith("lease expired") for e in job.errors), job
    assert late <= discarded
    assert "database available again" in logs
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 460}
    record_figures(
        "04-network-blackhole",
        verdict.figures(
            recovery_seconds=verdict.recovery_seconds(reset_at),
            blackhole_seconds=round((reset_at - blackholed_at).total_seconds(), 3),
            jobs_held_by_cut_off_worker=len(held),
            late_outcomes_discarded=len(late),
            connections_reset=reset,
        ),
    )


def test_a_pulled_cable_is_noticed_by_tcp_timers_mid_statement_and_the_worker_recovers(
    start_server, record_figures, tmp_path: Path
) -> None:
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = start_server()
    socket_path = server.directory / f".s.PGSQL.{server.port}"
    with (
        netns.IsolatedNetwork(socket_path) as network,
        FaultRun.prepared(server.url(), tmp_path) as run,
    ):
        # pgqueue's own TCP timers, nothing set in the connection string.
        inside = f"postgresql://{SUPERUSER}@127.0.0.1:{network.port}/postgres"
        isolated = run.start_workers(
            1,
            url=inside,
            name="isolated",
            prefix=network.command_prefix,
            lease_seconds=1.5,
            heartbeat_seconds=0.3,
        )
        direct = run.start_workers(1, name="direct", lease_seconds=1.5, heartbeat_seconds=0.3)
        run.produce(400, ms=[50, 150])
        pid = isolated.processes[0].pid
        before: set[int] = set()

        def pull() -> None:
            before.clear()
            before.update(netns.established_connections(pid))
            network.pull_cable()

        held = _cut_while_holding(run, pid, pull, network.plug_cable)
        pulled_at = run.now()
        # Nothing answers on the dead path, so only TCP's own timers can end the
        # worker's connections (an idle one by keepalives, one with a statement in flight
        # by TCP_USER_TIMEOUT), and they must, with the cable still out: within about
        # 30 s, where retransmissions alone would go on for about fifteen minutes.
        wait_for(
            lambda: not before & netns.established_connections(pid),
            timeout=90,
            what="TCP's timers to give up on the worker's connections",
        )
        noticed_at = run.now()
        wait_for(
            lambda: all(run.queue.get(job_id).state is JobState.SUCCEEDED for job_id in held),
            what="the direct worker to run the isolated worker's jobs",
        )
        # From here on only the isolated worker can finish the work.
        assert direct.stop() == [0]
        network.plug_cable()
        plugged_at = run.now()
        run.produce(40, prefix="after")
        wait_for(
            lambda: [
                job_id
                for job_id in run.claimed_by(pid, "succeeded")
                if run.queue.get(job_id).finished_at > plugged_at
            ],
            what="the isolated worker to complete a job after the cable is back",
        )
        run.wait_until_done()
        verdict = run.verdict()
        logs = isolated.logs()
        rescued = [run.queue.get(job_id) for job_id in held]

    assert held and before
    for job in rescued:
        assert job.result["pid"] == direct.processes[0].pid, job
    assert "database unavailable" in logs
    assert verdict.broken_promises() == {}
    assert verdict.states == {"succeeded": 440}
    record_figures(
        "04-cable-pulled",
        verdict.figures(
            noticed_after_seconds=round((noticed_at - pulled_at).total_seconds(), 3),
            cable_out_seconds=round((plugged_at - pulled_at).total_seconds(), 3),
            recovery_seconds=verdict.recovery_seconds(plugged_at),
            jobs_held_by_isolated_worker=len(held),
        ),
    )
