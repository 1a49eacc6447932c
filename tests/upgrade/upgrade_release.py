"""The previous release of pgqueue, installed as its users have it.

The release is the commit that ``previous-release.txt`` pins. Its distributions
(pgqueue-core, pgqueue-worker and the example plugin) are taken from the repository's
history with ``git archive`` and installed, not editable, into a virtualenv of their
own; third-party distributions come from the package index. That virtualenv is cached
per commit and Python version in a folder that outlives a run (``PGQUEUE_UPGRADE_CACHE``,
else ``$XDG_CACHE_HOME/pgqueue/previous-releases``, else ``~/.cache/...``), and made
under a file lock, so the test processes of one run, or of runs side by side, build it
once and share it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN = Path(__file__).with_name("previous-release.txt")
# What a user of the worker with the example handlers installs; the folders as they are
# at the pinned commit.
DISTRIBUTIONS = ("packages/pgqueue-core", "packages/pgqueue-worker", "plugins/pgqueue-examples")
# Written into a cached virtualenv last, once it is complete and works: one without it
# is the remains of an interrupted build, and is built again.
COMPLETE = "previous-release-complete"
_HASH = re.compile(r"^[0-9a-f]{40}$")


class ReleaseUnavailable(Exception):
    """The previous release cannot be installed here; the message says why and what to do."""


def pinned_commit() -> str:
    """The full hash of the commit ``previous-release.txt`` pins."""
    lines = [
        line.strip()
        for line in PIN.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) != 1 or not _HASH.match(lines[0]):
        raise ReleaseUnavailable(
            f"{PIN.relative_to(ROOT)} must hold one full 40-character commit hash besides "
            f"its # comments; it holds {lines!r}"
        )
    return lines[0]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a shell with none of the test run's virtualenv, Python path or
    pgqueue settings: the previous release's commands get their database from flags."""
    dropped = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "DATABASE_URL"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PGQUEUE")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=120)


def check_in_history(commit: str) -> None:
    """Raise ReleaseUnavailable unless ``commit`` is in this checkout's git history."""
    if shutil.which("git") is None:
        raise ReleaseUnavailable("git is not installed: the previous release comes from git")
    if _git("rev-parse", "--git-dir").returncode != 0:
        raise ReleaseUnavailable(
            f"{ROOT} is not a git checkout: the previous release ({commit}, pinned in "
            f"{PIN.relative_to(ROOT)}) comes from the repository's history; run the "
            f"upgrade test in a clone"
        )
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true"
        fix = (
            "this clone is shallow: git fetch --unshallow"
            if shallow
            else "fetch the branch it was released from, or fix the pin"
        )
        raise ReleaseUnavailable(
            f"commit {commit} (the previous release, pinned in {PIN.relative_to(ROOT)}) "
            f"is not in this clone's history: {fix}"
        )


def released_file(commit: str, path: str) -> str:
    """The text of ``path`` (from the repository's root) as the release has it."""
    shown = _git("show", f"{commit}:{path}")
    if shown.returncode != 0:
        raise ReleaseUnavailable(f"the release {commit} has no {path}: {shown.stderr.decode()}")
    return shown.stdout.decode()


def released_folder(commit: str, path: str) -> list[str]:
    """The names of the files in folder ``path`` as the release has it."""
    listed = _git("ls-tree", "--name-only", f"{commit}:{path}")
    if listed.returncode != 0:
        raise ReleaseUnavailable(f"the release {commit} has no {path}: {listed.stderr.decode()}")
    return listed.stdout.decode().split()


def cache_root() -> Path:
    """Where the previous releases' virtualenvs are kept between runs."""
    if os.environ.get("PGQUEUE_UPGRADE_CACHE"):
        return Path(os.environ["PGQUEUE_UPGRADE_CACHE"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pgqueue" / "previous-releases"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def installed_release(commit: str) -> Path:
    """The virtualenv with the release ``commit`` installed: the cached one, or one made
    now (the caller checked that the commit is in the history)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    name = f"{commit}-py{sys.version_info.major}{sys.version_info.minor}"
    venv = root / name
    with _locked(root / f"{name}.lock"):
        if _works(venv, commit):
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=f"{name}-source-") as source:
            _extract(commit, Path(source))
            _install(venv, [Path(source) / folder for folder in DISTRIBUTIONS])
        if not _works(venv, None):
            raise ReleaseUnavailable(
                f"the release {commit} installed into {venv}, but its pgqueue does not run "
                f"(see `{venv / 'bin' / 'pgqueue'} --version`)"
            )
        (venv / COMPLETE).write_text(commit + "\n")
    return venv


def _extract(commit: str, into: Path) -> None:
    archive = into / "release.tar"
    made = _git("archive", "--format=tar", "-o", str(archive), commit, "--", *DISTRIBUTIONS)
    if made.returncode != 0:
        raise ReleaseUnavailable(
            f"git archive of the release {commit} failed: {made.stderr.decode().strip()}"
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise ReleaseUnavailable(
                "uv is not installed: pip install -r requirements-dev.txt"
            ) from None
        return found
    return find_uv_bin()


def _install(venv: Path, folders: list[Path]) -> None:
    """A fresh virtualenv at ``venv`` with ``folders`` built and installed, not editable."""
    uv = _uv()
    steps = [
        [uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
        + [str(folder) for folder in folders],
    ]
    for step in steps:
        done = subprocess.run(step, env=clean_env(), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise ReleaseUnavailable(
                f"installing the previous release failed: {' '.join(step)}: {done.stderr.strip()}"
            )


def _works(venv: Path, commit: str | None) -> bool:
    """Whether ``venv`` is a complete install (of ``commit``, unless None) that runs."""
    if commit is not None:
        marker = venv / COMPLETE
        if not marker.exists() or marker.read_text().strip() != commit:
            return False
    try:
        shown = subprocess.run(
            [str(venv / "bin" / "pgqueue"), "plugins", "--json"],
            env=clean_env(),
            cwd=venv,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except OSError:  # no virtualenv, or one whose Python has gone
        return False
    # pgqueue runs, and finds the example tasks through their entry point.
    return shown.returncode == 0 and '"echo"' in shown.stdout
