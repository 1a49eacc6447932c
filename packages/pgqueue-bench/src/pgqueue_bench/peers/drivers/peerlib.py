"""What the peer scripts share. Standard library only (but for the psycopg of
:func:`report_from_tables`): each peer runs in a virtualenv of its own, where pgqueue
is not installed.

Every peer script answers the same subcommands (:func:`serve` reads them), which
``pgqueue_bench.peers`` drives:

``version``
    print the peer's package version
``setup``
    install the peer's tables into an empty database
``enqueue --jobs N [--setting NAME=VALUE ...]``
    pre-load N no-op jobs whose payload is their sequence number 0..N-1 (pgqueue's
    ``partition_keys=K`` spreads them over K partition keys; the peers take no setting)
``work --seen-file F [--drain] [--sleep-ms MS]``
    run one worker process: print ``ready`` once connected, start on a line on
    stdin, and with ``--drain`` exit when the queue is empty (else on SIGTERM);
    at exit write the sequence numbers this process ran to F, one per line, and
    the CPU seconds it used from its first job to F with the suffix ``.cpu``
    (each job is noted with ``ran``).
    With ``--sleep-ms``, every job's handler is ``async def`` and awaits
    ``asyncio.sleep`` of that long before it remembers its job
``produce --jobs N --rate R``
    enqueue N no-op jobs at R per second, one per transaction
``report [--latencies]``
    print JSON: jobs completed, the most starts of one job, seconds from the
    first claim to the last completion, and with ``--latencies`` each job's
    pickup latency in milliseconds, all read from the peer's own tables
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from functools import cache
from pathlib import Path

NOOP_TASK = "bench_noop"

# The sequence numbers this process ran, for peers whose handlers are found by
# import path (pgqueue's ``--handlers peerlib:PGQUEUE_HANDLERS``).
SEEN: list[int] = []


# This process's CPU seconds (every thread's) when its first job ran, or None before.
_CPU_AT_FIRST_JOB: float | None = None


def ran(seen: list[int], seq: int) -> None:
    """Note that this process ran job ``seq``, and the CPU time of its first job: the
    CPU each system spends draining is counted from there (see :func:`write_seen`), so
    what a worker does once at start-up is left out."""
    global _CPU_AT_FIRST_JOB
    if _CPU_AT_FIRST_JOB is None:
        _CPU_AT_FIRST_JOB = time.process_time()
    seen.append(seq)


def remember(payload: dict) -> None:
    """A no-op pgqueue handler that remembers which job it ran."""
    ran(SEEN, int(payload["seq"]))


PGQUEUE_HANDLERS = {NOOP_TASK: remember}

# Seconds the async handlers sleep (set from ``work --sleep-ms`` before they run).
SLEEP_SECONDS = 0.0


async def sleep_then_remember(payload: dict) -> None:
    """An async pgqueue handler that awaits ``asyncio.sleep(SLEEP_SECONDS)``, then
    remembers which job it ran."""
    await asyncio.sleep(SLEEP_SECONDS)
    ran(SEEN, int(payload["seq"]))


PGQUEUE_ASYNC_HANDLERS = {NOOP_TASK: sleep_then_remember}
_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    """The named statements of ``queries.sql`` beside this file. Parsed here as
    ``pgqueue.queries.named_statements`` parses them: this module also runs in the peers'
    virtualenvs, which do not have pgqueue."""
    text = (Path(__file__).parent / "queries.sql").read_text()
    parts = _NAME_LINE.split(text)
    bodies = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        bodies[name] = "\n".join(lines).strip().rstrip(";")
    return bodies


def command_line(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the shared subcommands and their options."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version")
    for name in ("setup", "enqueue", "work", "produce", "report"):
        command = sub.add_parser(name)
        command.add_argument("--database-url", required=True)
        if name in ("enqueue", "produce"):
            command.add_argument("--jobs", type=int, required=True)
        if name == "enqueue":
            command.add_argument(
                "--setting",
                action="append",
                default=[],
                metavar="NAME=VALUE",
                help="How the jobs are made: for pgqueue, partition_keys (repeatable).",
            )
        if name == "produce":
            command.add_argument("--rate", type=float, required=True)
        if name == "work":
            command.add_argument("--seen-file", type=Path, required=True)
            command.add_argument("--drain", action="store_true")
            command.add_argument(
                "--sleep-ms",
                type=float,
                default=0.0,
                help="Each handler awaits asyncio.sleep of this long (0: a no-op handler).",
            )
            command.add_argument(
                "--setting",
                action="append",
                default=[],
                metavar="NAME=VALUE",
                help="A documented worker setting of the peer, or for pgqueue a queue setting "
                "(queue_concurrency_limit, queue_rate_limit) (repeatable).",
            )
        if name == "report":
            command.add_argument("--latencies", action="store_true")
    return parser.parse_args(argv)


def serve(
    description: str, version: dict[str, object], *, report_tables: str | None = None
) -> None:
    """Run the subcommand on the command line with the functions of the peer script run
    as ``__main__``, each named after its subcommand and taking its options in order
    (``work``: the database URL, seen file, drain, settings and sleep in milliseconds);
    one that returns a coroutine runs under asyncio. ``version`` prints ``version``;
    ``report`` prints what ``peer.report`` returns or, given ``report_tables``, what
    :func:`report_from_tables` reads for that system."""
    peer = sys.modules["__main__"]
    args = command_line(description)
    if args.command == "version":
        print_json(version)
        return
    url = args.database_url
    calls: dict[str, Callable[[], object]] = {
        "setup": lambda: peer.setup(url),
        "enqueue": lambda: peer.enqueue(url, args.jobs, settings(args.setting)),
        "produce": lambda: peer.produce(url, args.jobs, args.rate),
        "work": lambda: peer.work(
            url, args.seen_file, args.drain, settings(args.setting), args.sleep_ms
        ),
        "report": lambda: (
            report_from_tables(url, report_tables, args.latencies)
            if report_tables
            else peer.report(url, args.latencies)
        ),
    }
    result = calls[args.command]()
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    if args.command == "report":
        print_json(result)


def report_from_tables(url: str, system: str, latencies: bool) -> dict[str, object]:
    """The ``report`` of a peer whose figures ``queries.sql`` reads from its own tables:
    the columns of ``<system>_report`` by name and, with ``latencies``, every value of
    ``<system>_latencies`` as ``latencies_ms``. Read with psycopg, which every peer's
    virtualenv has (the only import here from outside the standard library)."""
    import psycopg

    with psycopg.connect(url) as conn:
        cursor = conn.execute(queries()[f"{system}_report"])
        names = [column.name for column in cursor.description or ()]
        out: dict[str, object] = dict(zip(names, cursor.fetchone() or (), strict=True))
        if latencies:
            rows = conn.execute(queries()[f"{system}_latencies"]).fetchall()
            out["latencies_ms"] = [value for (value,) in rows]
    return out


def settings(pairs: Iterable[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs as a dict."""
    return dict(pair.split("=", 1) for pair in pairs)


def refuse_settings(peer: str, given: dict[str, str]) -> None:
    """Exit with a one-line error if ``given`` holds settings ``peer`` does not take."""
    if given:
        raise SystemExit(f"{peer} takes no such setting: {', '.join(sorted(given))}")


def wait_for_go() -> None:
    """The start barrier: say we are ready, then wait for the driver's go."""
    print("ready", flush=True)
    sys.stdin.readline()


def write_seen(path: Path, seen: Iterable[int]) -> None:
    """Record the sequence numbers this process ran, and beside them the CPU seconds
    it used from its first job (see :func:`ran`) to now, its exit: 0 if it ran none."""
    path.write_text("".join(f"{seq}\n" for seq in seen))
    used = 0.0 if _CPU_AT_FIRST_JOB is None else time.process_time() - _CPU_AT_FIRST_JOB
    cpu_path(path).write_text(f"{used:.6f}\n")


def cpu_path(seen_file: Path) -> Path:
    """Where ``write_seen`` puts the CPU seconds of the process of ``seen_file``."""
    return seen_file.with_name(seen_file.name + ".cpu")


def print_json(value: object) -> None:
    """The one line of output the driver reads."""
    print(json.dumps(value), flush=True)


async def on_schedule(jobs: int, rate: float) -> AsyncIterator[int]:
    """Yield 0..jobs-1, each at its due time on a fixed-rate schedule (not a fixed
    pause, so the rate does not drift with the time each enqueue takes)."""
    start = time.monotonic()
    for seq in range(jobs):
        pause = start + seq / rate - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        yield seq
