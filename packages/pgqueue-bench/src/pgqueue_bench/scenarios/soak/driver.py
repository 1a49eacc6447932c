"""``pgqueue bench soak``: an hour of chaos under a mixed, realistic workload.

A private cluster (never a shared server: it is crashed on purpose) runs a schema with
the audit trail installed; three ``pgqueue worker`` processes on the host, and a fourth
in a network namespace of its own whose cable the chaos loop can pull, serve it; a real
``pgqueue-api`` takes the HTTP producers' jobs. The workload
(:mod:`~pgqueue_bench.scenarios.soak.workload`) runs at a steady rate for ``--minutes`` while the
chaos loop (:mod:`~pgqueue_bench.scenarios.soak.chaos`) injects a random fault every
``--fault-every`` seconds and the sampler (:mod:`~pgqueue_bench.scenarios.soak.samples`) measures
every ``--sample-seconds``. Then the producers stop, the schedule is switched off, the
queue drains, and the verdict (:mod:`~pgqueue_bench.scenarios.soak.verdict`) is computed from the
audit trail, the producers' acknowledgements, the workers' logs and the samples.

Results go to ``--output`` (``results/soak.json``) and ``--plot`` (``results/soak.png``);
the command exits 1, with one line per failed item, when the verdict fails.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx

from pgqueue import DatabaseUnavailable, Queue, migrate
from pgqueue_bench import results
from pgqueue_bench.charts import soak as plot_soak
from pgqueue_bench.infra import environment, netns
from pgqueue_bench.infra.apiserver import api_server
from pgqueue_bench.infra.binaries import binaries_for
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.infra.servers import LOOPBACK, SUPERUSER, PrivateServer, quiet_pool_logs
from pgqueue_bench.options import seconds_range
from pgqueue_bench.scenarios.soak import samples as soak_samples
from pgqueue_bench.scenarios.soak import verdict as soak_verdict
from pgqueue_bench.scenarios.soak.chaos import Chaos
from pgqueue_bench.scenarios.soak.evidence import collect_evidence
from pgqueue_bench.scenarios.soak.samples import Sampler
from pgqueue_bench.scenarios.soak.tasks import (
    LIMITED_QUEUE,
    RUN_DIR_VARIABLE,
    SCHEDULE_NAME,
    SCHEDULE_QUEUE,
    SOAK_QUEUE,
)
from pgqueue_bench.scenarios.soak.workload import Workload, WorkloadSettings
from pgqueue_bench.verdict import audit

SCHEMA = "soak"
# Autovacuum looks at each table every 10 s instead of every minute: the pruned
# history's partitions, unlike active_jobs, have no tuning of their own, and a short
# run must see their dead rows reclaimed within it too.
SERVER_SETTINGS = {"autovacuum_naptime": "10s"}
API_POOL_SIZE = 4


@dataclass(frozen=True)
class SoakSettings:
    """One soak's shape; recorded in the results' parameters."""

    minutes: float = 60.0
    fault_every: tuple[float, float] = (60.0, 180.0)
    sample_seconds: float = 10.0
    seed: int = 1
    workers: int = 3
    concurrency: int = 8
    lease_seconds: float = 10.0
    drain_seconds: float = 180.0
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)

    def worker_settings(self) -> WorkerSettings:
        """Short leases and a quick reaper, so frozen and cut-off workers' jobs come back
        within seconds; the worker's own pruner rounds run often, with the retention."""
        keep = f"{self.workload.retention_seconds:g}s"
        return WorkerSettings(
            queue=SOAK_QUEUE,
            concurrency=self.concurrency,
            lease_seconds=self.lease_seconds,
            reap_interval=2.0,
            retry_base=0.5,
            retry_cap=10.0,
            shutdown_timeout=10,
            extra_args=(
                *("--queue", LIMITED_QUEUE, "--queue", SCHEDULE_QUEUE),
                *("--plugin", "pgqueue_bench.scenarios.soak.tasks", "--no-plugin-autoload"),
                *("--prune-succeeded-after", keep, "--prune-cancelled-after", keep),
                *("--prune-dead-after", keep, "--prune-interval", "30s"),
            ),
        )


def _wait_drained(queue: Queue, seconds: float) -> bool:
    """Wait until no job is waiting, queued or running; False after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(DatabaseUnavailable):  # the pool may still reconnect
            counts: dict[str, int] = {}
            for stats in queue.stats():
                for state, jobs in stats.counts.items():
                    counts[state] = counts.get(state, 0) + jobs
            if not any(counts.get(state, 0) for state in ("waiting", "queued", "running")):
                return True
        time.sleep(0.5)
    return False


@dataclass
class SoakRun:
    """What one soak measured, before it is judged."""

    settings: SoakSettings
    server: dict[str, Any]
    samples: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    fault_kinds: tuple[str, ...]
    workload: dict[str, Any]
    evidence: dict[str, Any]
    drained: bool
    unexpected_exits: list[tuple[int, int]]
    errors: list[str]
    blackhole_unavailable: str | None


def _start_workers(
    stack: contextlib.ExitStack, server: PrivateServer, settings: SoakSettings, run_dir: Path
) -> tuple[WorkerFleet, WorkerFleet | None, netns.IsolatedNetwork | None]:
    """The host workers and, where a network namespace can be made, the isolated one
    (reaching the server's Unix socket through a proxy inside the namespace)."""
    worker_env = {RUN_DIR_VARIABLE: str(run_dir)}
    fleet = WorkerFleet(
        server.url(),
        SCHEMA,
        settings.worker_settings(),
        run_dir / "workers",
        environment=worker_env,
    )
    stack.enter_context(fleet)
    fleet.start(settings.workers)
    network = isolated = None
    if netns.unavailable_reason() is None:
        socket = server.directory / f".s.PGSQL.{server.port}"
        network = stack.enter_context(netns.IsolatedNetwork(socket))
        isolated = WorkerFleet(
            f"postgresql://{SUPERUSER}@{LOOPBACK}:{network.port}/postgres",
            SCHEMA,
            settings.worker_settings(),
            run_dir / "isolated",
            prefix=network.command_prefix,
            environment=worker_env,
        )
        stack.enter_context(isolated)
        isolated.start(1)
    return fleet, isolated, network


def run_soak(
    settings: SoakSettings, *, like_url: str | None, echo: Callable[[str], object] = click.echo
) -> SoakRun:
    """Run one soak on a private cluster of the PostgreSQL version ``like_url`` runs
    (default: the embedded one)."""
    quiet_pool_logs()
    with (
        tempfile.TemporaryDirectory(prefix="pgqueue-soak-") as scratch,
        PrivateServer(binaries_for(like_url), settings=SERVER_SETTINGS) as server,
        contextlib.ExitStack() as stack,
    ):
        run_dir = Path(scratch)
        url = server.url()
        server_env = environment.postgresql(url, f"private cluster, {server.binaries.label}")
        migrate(url, SCHEMA)
        audit.install(url, SCHEMA)
        soak_samples.prepare(url, SCHEMA)
        # The connection count is judged flat: pools that may grow and shrink by many
        # connections would blur it. The driver's own pool is fixed, the API's small.
        queue = Queue.connect(url, schema=SCHEMA, min_size=4, max_size=4, pool_timeout=10)
        stack.callback(queue.close)
        queue.update_queue(
            LIMITED_QUEUE, concurrency_limit=settings.workload.limited_concurrency, create=True
        )
        fleet, isolated, network = _start_workers(stack, server, settings, run_dir)
        fleets = [fleet, *([isolated] if isolated else [])]
        for group in fleets:
            group.wait_serving()
        api = stack.enter_context(api_server(url, SCHEMA, workers=1, pool_size=API_POOL_SIZE))
        client = stack.enter_context(httpx.Client(base_url=api.base_url, timeout=30))

        def processes() -> dict[str, int]:
            found = {f"api {api.pid}": api.pid}
            for group in fleets:
                found |= {f"worker {p.pid}": p.pid for p in group.running()}
            return found

        started = time.monotonic()
        until = started + settings.minutes * 60
        sampler = Sampler(url, SCHEMA, settings.sample_seconds, processes, started).start()
        workload = Workload(queue, client, settings.workload, settings.seed)
        workload.start()
        chaos = Chaos(
            server,
            fleet,
            lease_seconds=settings.lease_seconds,
            rng=random.Random(settings.seed),
            started=started,
            isolated=isolated,
            network=network,
        )
        echo(f"soak: {settings.minutes:g} min on {server_env['version'].split(' on ')[0]}")
        echo(f"soak: faults from {', '.join(chaos.kinds)}")
        try:
            chaos.run(until, settings.fault_every, report=lambda line: echo(f"fault {line}"))
            time.sleep(max(0.0, until - time.monotonic()))
        finally:
            workload.stop()
        # Ticks would keep the queue from ever being empty: the operator's switch.
        with contextlib.suppress(DatabaseUnavailable):  # it ends its ticks in the drain then
            queue.set_schedule_enabled(SCHEDULE_NAME, False)
        echo("soak: producers stopped, draining")
        drained = _wait_drained(queue, settings.drain_seconds)
        sampler.stop()
        for group in fleets:
            group.stop()
        evidence = collect_evidence(url, SCHEMA, queue, run_dir, fleets, workload)
        errors = workload.errors() + ([repr(sampler.error)] if sampler.error else [])
        return SoakRun(
            settings=settings,
            server=server_env,
            samples=sampler.samples,
            faults=chaos.faults,
            fault_kinds=chaos.kinds,
            workload=workload.figures(),
            evidence=evidence,
            drained=drained,
            unexpected_exits=[exit for group in fleets for exit in group.unexpected_exits()],
            errors=errors,
            blackhole_unavailable=netns.unavailable_reason() if network is None else None,
        )


def judge(run: SoakRun) -> dict[str, Any]:
    """The verdict of ``run``: the audit items, then resources, history and recovery."""
    settings, bounds = run.settings, soak_verdict.Bounds.for_minutes(run.settings.minutes)
    expected_samples = int(settings.minutes * 60 / settings.sample_seconds)
    taken = [s for s in run.samples if s["missing"] is None]
    fault_errors = [f"{f['kind']}: {f['error']}" for f in run.faults if f["error"]]
    found = soak_verdict.recoveries(run.samples, run.faults, bounds, settings.minutes * 60)
    items = [
        *run.evidence["items"],
        {
            "name": "samples",
            "value": len(taken),
            "bound": f">= 90% of {expected_samples} (missing: {len(run.samples) - len(taken)})",
            "passed": len(taken) >= 0.9 * expected_samples,
            "detail": None,
        },
        *soak_verdict.resource_items(run.samples, bounds),
        soak_verdict.history_item(
            run.samples,
            bounds,
            settings.workload.retention_seconds,
            settings.workload.prune_every_seconds,
        ),
        soak_verdict.recovery_item(found, bounds),
        {
            "name": "faults_injected",
            "value": len(run.faults),
            "bound": ">= 1, none failing to inject",
            "passed": bool(run.faults) and not fault_errors,
            "detail": fault_errors or None,
        },
        {
            "name": "errors",
            "value": len(run.errors) + len(run.unexpected_exits) + (not run.drained),
            "bound": "= 0 (producer, operator or sampler errors; workers exiting on their "
            "own; a queue that did not drain)",
            "passed": not run.errors and not run.unexpected_exits and run.drained,
            "detail": {
                "errors": run.errors,
                "unexpected_worker_exits": run.unexpected_exits,
                "drained": run.drained,
            },
        },
    ]
    return soak_verdict.verdict(items, bounds) | {"recoveries": found}


def document(run: SoakRun, verdict: dict[str, Any]) -> dict[str, Any]:
    """The results document of ``run``."""
    settings = run.settings
    parameters = {
        **asdict(settings),
        "fault_kinds": list(run.fault_kinds),
        "server_settings": SERVER_SETTINGS,
        "api_pool_size": API_POOL_SIZE,
        "blackhole_unavailable": run.blackhole_unavailable,
        "retention": (
            f"history pruned every {settings.workload.prune_every_seconds:g} s to "
            f"{settings.workload.retention_seconds:g} s (Queue.prune, as `pgqueue prune "
            "--older-than` from cron); the workers' own pruner also runs every 30 s with that "
            "retention, but it drops whole UTC days, and today's cannot expire within the run"
        ),
    }
    return results.document(
        "soak",
        environment=environment.describe_with(run.server),
        parameters=parameters,
        samples=run.samples,
        faults=run.faults,
        workload=run.workload,
        audit=run.evidence["figures"],
        verdict=verdict,
    )


@click.command("soak")
@click.option("--minutes", type=click.FloatRange(min=1), default=60, show_default=True)
@click.option(
    "--fault-every",
    default="60-180",
    show_default=True,
    callback=seconds_range,
    metavar="MIN-MAX",
    help="Seconds of quiet before each fault, drawn at random from this range.",
)
@click.option("--sample-seconds", type=click.FloatRange(min=1), default=10, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("results/soak.json"),
    show_default=True,
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("results/soak.png"),
    show_default=True,
)
@click.option(
    "--database-url",
    envvar="DATABASE_URL",
    help="Only picks the PostgreSQL version: the soak always runs a private cluster of it.",
)
def soak_command(
    minutes: float,
    fault_every: tuple[float, float],
    sample_seconds: float,
    seed: int,
    output: Path,
    plot_path: Path,
    database_url: str | None,
) -> None:
    """An hour of chaos: a mixed workload under random faults; exit 1 if the verdict fails."""
    settings = SoakSettings(
        minutes=minutes,
        fault_every=fault_every,
        sample_seconds=sample_seconds,
        seed=seed,
        workload=WorkloadSettings.for_minutes(minutes),
    )
    run = run_soak(settings, like_url=database_url)
    verdict = judge(run)
    content = document(run, verdict)
    path = results.write_to(output, content)
    click.echo(f"wrote {path}")
    click.echo(f"wrote {plot_soak.plot_soak(content, plot_path)}")
    for item in verdict["items"]:
        click.echo(soak_verdict.describe(item))
    if not verdict["passed"]:
        for item in verdict["items"]:
            if item["passed"] is False:
                click.echo(f"soak verdict failed: {soak_verdict.describe(item).strip()}", err=True)
        raise click.exceptions.Exit(1)
