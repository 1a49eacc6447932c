"""nox sessions for pgqueue. `nox -l` lists them; `nox -s tests` is what CI runs.

Every session installs the whole monorepo editable from requirements-dev.txt, so no
distribution is ever left out of a check.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


def install_repo(session: nox.Session) -> None:
    """Install every distribution of the repository, editable, with the dev tools."""
    session.install("-r", "requirements-dev.txt")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the packages that [tool.mypy] in pyproject.toml names."""
    install_repo(session)
    session.run("mypy", *session.posargs)


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """Unit tests that need no database."""
    install_repo(session)
    session.run("pytest", "tests/unit", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole suite on real PostgreSQL: DATABASE_URL if set, else embedded PostgreSQL 18."""
    install_repo(session)
    # The fault scenarios record their figures; those of this shorter run (a 10 s
    # deadlock hunt) go to a scratch folder, not over `nox -s faults`' in results/.
    # One test process more than the cores: much of the suite's time is spent waiting on
    # worker processes, servers and timers, so one process a core leaves them idle. But
    # one a core against a server given as DATABASE_URL: every test process starts
    # worker processes and API servers with connections of their own, and three at once
    # ran out PostgreSQL 15's default 100 connections ("too many clients already").
    cores = os.cpu_count() or 1
    processes = str(cores if os.environ.get("DATABASE_URL") else cores + 1)
    session.run(
        "pytest",
        "-n",
        processes,
        *session.posargs,
        env={"PGQUEUE_RESULTS_DIR": session.create_tmp()},
    )


@nox.session(python=PYTHON, default=False)
def model(session: nox.Session) -> None:
    """The state-machine test for PGQUEUE_MODEL_SECONDS (1200 unless set); results/model.json."""
    install_repo(session)
    seconds = os.environ.get("PGQUEUE_MODEL_SECONDS", "1200")
    session.run(
        "pytest",
        "tests/model",
        "-k",
        "for_minutes",
        *session.posargs,
        env={"PGQUEUE_MODEL_SECONDS": seconds},
    )


@nox.session(python=PYTHON, default=False)
def crash(session: nox.Session) -> None:
    """SIGKILL workers at random while they work; results/crash.json (pgqueue bench crash)."""
    install_repo(session)
    session.run("pgqueue", "bench", "crash", *session.posargs)


@nox.session(python=PYTHON, default=False)
def controls(session: nox.Session) -> None:
    """Pause/resume latency and limits with real workers; results/controls.json."""
    install_repo(session)
    session.run("pgqueue", "bench", "controls", *session.posargs)


@nox.session(python=PYTHON, default=False)
def faults(session: nox.Session) -> None:
    """Fault injection on private clusters (a minute of deadlock hunting), then side
    effects under chaos; results/faults.json and results/effects.json."""
    install_repo(session)
    session.run(
        "pytest",
        "-n",
        "2",
        "tests/faults",
        *session.posargs,
        env={"PGQUEUE_FAULTS_DEADLOCK_SECONDS": "60"},
    )
    session.run("pgqueue", "bench", "effects")


@nox.session(python=PYTHON, default=False)
def restart(session: nox.Session) -> None:
    """Restart PostgreSQL (fast, immediate) under load; results/restart.json."""
    install_repo(session)
    session.run("pgqueue", "bench", "restart", *session.posargs)


@nox.session(python=PYTHON, default=False)
def soak(session: nox.Session) -> None:
    """An hour of chaos under a mixed workload; results/soak.json and soak.png (pgqueue bench soak)."""
    install_repo(session)
    session.run("pgqueue", "bench", "soak", *session.posargs)


# The peers run side by side with pgqueue, each in a virtualenv of its own so that
# none of their dependencies meets pgqueue's. Each environment session records the
# Python it built, for the sessions that require it.
PEERS = {"procrastinate": ["procrastinate"], "pgqueuer": ["pgqueuer[asyncpg]"]}
PEER_PYTHONS: dict[str, str] = {}


def _peer_environment(peer: str, requirements: list[str]) -> None:
    def environment(session: nox.Session) -> None:
        session.install("--upgrade", *requirements, "psycopg[binary]")
        PEER_PYTHONS[peer] = str(Path(session.bin) / "python")

    environment.__doc__ = f"A virtualenv with the latest {peer}, for the side-by-side runs."
    nox.session(python=PYTHON, name=f"peer-{peer}", default=False)(environment)


for _peer, _requirements in PEERS.items():
    _peer_environment(_peer, _requirements)


def run_peers(session: nox.Session, *args: str) -> None:
    """Run the side-by-side runs (``python -m pgqueue_bench.peers``) with every peer's Python."""
    pythons = [f"--peer={peer}={PEER_PYTHONS[peer]}" for peer in PEERS]
    session.run("python", "-m", "pgqueue_bench.peers", *pythons, *args)


@nox.session(python=PYTHON, default=False, requires=[f"peer-{peer}" for peer in PEERS])
def peers(session: nox.Session) -> None:
    """pgqueue, procrastinate and PgQueuer side by side; results/peers.json and plots."""
    install_repo(session)
    run_peers(session, *session.posargs)


@nox.session(python=PYTHON, default=False, requires=[f"peer-{peer}" for peer in PEERS])
def bench(session: nox.Session) -> None:
    """Throughput, latency, waits, fairness, peers, the drain with partition keys and plots
    into results/ (`-- --quick` for a short run)."""
    install_repo(session)
    quick = ["--quick"] if "--quick" in session.posargs else []
    # A private cluster of the same version has room for 32 worker processes' connections.
    session.run("pgqueue", "bench", "throughput", "--private-server", *quick)
    session.run("pgqueue", "bench", "latency", *quick)
    session.run("pgqueue", "bench", "wait")
    session.run("pgqueue", "bench", "fairness", *quick)
    run_peers(session, *quick)
    run_peers(session, "--keys", "100", *quick)
    session.run("pgqueue", "bench", "plot")
    session.notify("docs")


def install_wrk(session: nox.Session) -> None:
    """Debian's wrk, the HTTP load generator of `pgqueue bench enqueue`, when missing."""
    if shutil.which("wrk"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.error("wrk is not installed: install it (Debian: apt-get install wrk) and rerun")
    session.run("apt-get", "update", "-qq", external=True)
    session.run("apt-get", "install", "-y", "-qq", "wrk", external=True)


@nox.session(python=PYTHON, default=False, requires=[f"peer-{peer}" for peer in PEERS])
def enqueue(session: nox.Session) -> None:
    """The producer path: raw SQL, pgqueue, its API (wrk) and the peers; results/enqueue.json."""
    install_repo(session)
    install_wrk(session)
    pythons = [f"--peer={peer}={PEER_PYTHONS[peer]}" for peer in PEERS]
    session.run("pgqueue", "bench", "enqueue", *pythons, *session.posargs)
    session.notify("docs")


@nox.session(python=PYTHON, default=False)
def docs(session: nox.Session) -> None:
    """Regenerate results/README.md (from results/*.json) and docs/cli.md (from the commands)."""
    install_repo(session)
    session.run("pgqueue", "bench", "report")


@nox.session(python=PYTHON, default=False)
def build(session: nox.Session) -> None:
    """Wheels and sdists of every distribution into dist/, checked with twine."""
    session.install("uv", "twine")
    dist = Path("dist")
    # Only this build's files, so that twine checks exactly what would be uploaded.
    shutil.rmtree(dist, ignore_errors=True)
    # Every folder under packages/ and plugins/ with a pyproject.toml is a distribution.
    folders = sorted(p.parent for p in Path().glob("p*/*/pyproject.toml"))
    for folder in folders:
        # uv builds the sdist first and the wheel from it, so a file missing from the
        # sdist fails here rather than for whoever installs it.
        session.run("uv", "build", "--quiet", "--out-dir", str(dist), str(folder))
    built = sorted(str(path) for pattern in ("*.whl", "*.tar.gz") for path in dist.glob(pattern))
    session.run("twine", "check", "--strict", *built)
