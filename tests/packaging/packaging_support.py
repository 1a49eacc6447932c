"""pgqueue's distributions as their pyproject.toml files describe them, and uv, which
builds them and makes virtualenvs for them."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Distribution:
    """One folder under packages/ or plugins/ with a pyproject.toml."""

    folder: Path
    pyproject: dict[str, Any]

    @property
    def project(self) -> dict[str, Any]:
        return self.pyproject["project"]

    @property
    def name(self) -> str:
        return self.project["name"]

    @property
    def version(self) -> str:
        return self.project["version"]


def distributions() -> list[Distribution]:
    """Every distribution of the repository (the same glob as ``nox -s build``)."""
    return [
        Distribution(path.parent, tomllib.loads(path.read_text()))
        for path in sorted(ROOT.glob("p*/*/pyproject.toml"))
    ]


def uv() -> str:
    """The uv binary: the one requirements-dev.txt installs, else uv on PATH."""
    try:
        from uv import find_uv_bin
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise RuntimeError("uv is not installed: pip install -r requirements-dev.txt") from None
        return found
    return find_uv_bin()


def build_all(out_dir: Path) -> list[Path]:
    """Build the sdist and wheel of every distribution into ``out_dir``, as ``nox -s
    build`` does; return the wheels."""
    for dist in distributions():
        subprocess.run(
            [uv(), "build", "--quiet", "--out-dir", str(out_dir), str(dist.folder)],
            check=True,
            timeout=300,
        )
    return sorted(out_dir.glob("*.whl"))
