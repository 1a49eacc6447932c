"""A network namespace of its own, with a cable the test can pull.

A proxy (:mod:`pgqueue_bench.infra.proxy`) runs inside a new network namespace and forwards TCP on
that namespace's 127.0.0.1 to the private server's Unix socket (Unix sockets live in
the file system, so they cross namespaces). Processes started inside the namespace
reach PostgreSQL over TCP through it. Bringing the namespace's loopback down drops
every packet on that path, as a pulled cable or a silent firewall would: unlike a
proxy that merely stops forwarding, nothing answers the kernel's keepalive probes or
acknowledges data in flight, so only TCP's own timers can notice. The host's network
is never touched.

The fault scenarios (``tests/faults``) and the soak (``pgqueue bench soak``) both pull
this cable, so it lives in the bench package, which both import.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from pgqueue_bench.infra.processes import stop_processes

TOOLS = ("unshare", "nsenter", "ip")


def unavailable_reason() -> str | None:
    """Why this machine cannot make a network namespace, or None if it can."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (util-linux and iproute2 are needed)"
    probe = subprocess.run(
        ["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return (
            "cannot create a network namespace (needs root or CAP_SYS_ADMIN and "
            f"CAP_NET_ADMIN): {probe.stderr.strip() or f'exit {probe.returncode}'}"
        )
    return None


TCP_ESTABLISHED = "01"


def established_connections(pid: int) -> set[int]:
    """Socket inodes of the TCP (IPv4) connections process ``pid`` holds that its kernel
    still counts as established, from ``/proc/<pid>/net/tcp`` (the table of the process's
    own network namespace). Once TCP's timers give up on a connection it leaves that
    state, even before the process notices and closes it."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            held.add(int(target[len("socket:[") : -1]))
    established = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == TCP_ESTABLISHED and int(fields[9]) in held:
            established.add(int(fields[9]))
    return established


class IsolatedNetwork:
    """A network namespace where ``127.0.0.1:port`` leads to the Unix socket
    ``unix_socket``. Start processes inside it with :attr:`command_prefix`."""

    def __init__(self, unix_socket: Path, port: int = 5432) -> None:
        self.port = port
        self.process = subprocess.Popen(
            [
                "unshare",
                "--net",
                "--",
                sys.executable,
                "-m",
                "pgqueue_bench.infra.proxy",
                "--port",
                str(port),
                "--unix",
                str(unix_socket),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = self.process.stdout.readline().strip() if self.process.stdout else ""
        if ready != "ready":
            self.close()
            stderr = self.process.stderr.read() if self.process.stderr else ""
            raise RuntimeError(f"the namespace's proxy did not start: {stderr}")

    @property
    def command_prefix(self) -> tuple[str, ...]:
        """Prepend to a command to run it inside the namespace."""
        return ("nsenter", f"--net=/proc/{self.process.pid}/ns/net", "--")

    def _link(self, state: str) -> None:
        subprocess.run([*self.command_prefix, "ip", "link", "set", "lo", state], check=True)

    def pull_cable(self) -> None:
        """Drop every packet in the namespace from now on."""
        self._link("down")

    def plug_cable(self) -> None:
        """Let packets through again."""
        self._link("up")

    def close(self) -> None:
        stop_processes([self.process], 10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> IsolatedNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
