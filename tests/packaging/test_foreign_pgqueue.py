"""A module named ``pgqueue`` that is not pgqueue-core's package, found first on the
path: the commands and ``import pgqueue`` name it in one line instead of failing
obscurely (or importing it). tests/packaging/test_install_from_dist.py does the same with
the real PyPI project of that name in a virtualenv built from the wheels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pgqueue

BIN = Path(sys.executable).parent
# What the module in the way does if it is ever imported.
IMPORTED = "raise SystemExit('the module in the way was imported')\n"


def foreign_distribution(folder: Path, name: str = "pgqueue", version: str = "0.6") -> Path:
    """Install, by hand, a distribution ``name`` that provides a module ``pgqueue.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pgqueue.py").write_text(IMPORTED)
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("pgqueue\n")
    (info / "RECORD").write_text(f"pgqueue.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return folder


def run(argv: list[str], first_on_path: Path, cwd: Path | None = None):
    env = {**os.environ, "PYTHONPATH": str(first_on_path)}
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "was imported" not in result.stderr
    (line,) = result.stderr.splitlines()
    return line


@pytest.mark.parametrize("script", ["pgqueue", "pgqueue-api"])
def test_the_commands_name_a_foreign_distribution_in_one_line(tmp_path, script):
    folder = foreign_distribution(tmp_path / "site")
    line = one_error_line(run([str(BIN / script), "--version"], folder))
    assert line == (
        f"Error: `import pgqueue` finds {folder / 'pgqueue.py'}, from pgqueue 0.6, a project "
        f"unrelated to pgqueue-core that shares the name: pip uninstall pgqueue, or take "
        f"{folder} off the path"
    )


def test_a_worker_does_not_start_beside_it(tmp_path):
    folder = foreign_distribution(tmp_path / "site")
    line = one_error_line(run([str(BIN / "pgqueue"), "worker", "--burst"], folder))
    assert "from pgqueue 0.6" in line


def test_a_stray_module_of_no_distribution_is_named_too(tmp_path):
    (tmp_path / "pgqueue.py").write_text(IMPORTED)
    line = one_error_line(run([str(BIN / "pgqueue"), "status"], tmp_path))
    assert line == (
        f"Error: `import pgqueue` finds {tmp_path / 'pgqueue.py'}, which is not pgqueue-core's "
        f"package (no installed distribution holds it): rename or remove it, or take "
        f"{tmp_path} off the path"
    )


def test_import_pgqueue_raises_an_import_error_naming_it(tmp_path):
    folder = foreign_distribution(tmp_path / "site")
    result = run([sys.executable, "-c", "import pgqueue"], folder)
    assert result.returncode == 1
    assert "was imported" not in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("pgqueue_launcher.ForeignPgqueue: `import pgqueue` finds ")
    assert "from pgqueue 0.6, a project unrelated to pgqueue-core" in last
    # It is an ImportError, for code that handles those.
    caught = run(
        [sys.executable, "-c", "try:\n import pgqueue\nexcept ImportError as e:\n print(e.name)"],
        folder,
    )
    assert caught.stdout.strip() == "pgqueue"


def test_a_script_named_pgqueue_in_the_current_directory_is_named(tmp_path):
    # `python -c` puts the current directory first on the path.
    (tmp_path / "pgqueue.py").write_text(IMPORTED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", "import pgqueue"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert f"finds {tmp_path / 'pgqueue.py'}, which is not pgqueue-core's package" in result.stderr


def test_pgqueues_own_package_imports_as_usual(tmp_path):
    result = run([sys.executable, "-c", "import pgqueue; print(pgqueue.__file__)"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == pgqueue.__file__


def test_another_copy_of_pgqueues_own_package_is_not_foreign(tmp_path):
    # A checkout on PYTHONPATH in front of the installed package is still pgqueue.
    shutil.copytree(Path(pgqueue.__file__).parent, tmp_path / "pgqueue")
    result = run([sys.executable, "-c", "import pgqueue; print(pgqueue.__file__)"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "pgqueue" / "__init__.py")
    version = run([str(BIN / "pgqueue"), "--version"], tmp_path)
    assert version.returncode == 0, version.stderr
