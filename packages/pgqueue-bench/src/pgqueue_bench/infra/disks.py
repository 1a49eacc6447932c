"""A small filesystem to put a private cluster on, and a ballast file that fills it: the
disk-full faults, without touching any disk someone else uses.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_filesystem(size_mb: int = 256) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB mounted on a new temporary directory (needs root and a
    kernel that allows the mount), unmounted afterwards. Put a cluster on it with
    ``PrivateServer(directory=path / "cluster")`` and fill it with :func:`fill_disk`."""
    mount_point = Path(tempfile.mkdtemp(prefix="pgq-tmpfs-"))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(mount_point)],
        check=True,
        capture_output=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False, capture_output=True)
        shutil.rmtree(mount_point, ignore_errors=True)


def fill_disk(directory: Path, *, leave_bytes: int = 0) -> Path:
    """Write a ballast file in ``directory`` until its filesystem has at most
    ``leave_bytes`` free; delete the returned file to free the space again."""
    ballast = directory / "ballast"
    chunk = b"\0" * 2**20
    with ballast.open("wb") as out:
        while True:
            free = shutil.disk_usage(directory).free - leave_bytes
            if free <= 0:
                break
            try:
                out.write(chunk[: min(len(chunk), free)])
                out.flush()
            except OSError:
                break
    return ballast
