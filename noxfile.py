"""nox sessions for pgqueue. `nox -l` lists them; `nox -s tests` is what CI runs.

Every session installs the whole monorepo editable from requirements-dev.txt, so no
distribution is ever left out of a check.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]
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
def unit(session: nox.Session) -> None:
    """Unit tests that need no database."""
    install_repo(session)
    session.run("pytest", "tests/unit", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole suite on real PostgreSQL: DATABASE_URL if set, else embedded PostgreSQL 18."""
    install_repo(session)
    session.run("pytest", "-n", "auto", *session.posargs)
