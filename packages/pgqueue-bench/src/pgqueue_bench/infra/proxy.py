"""A TCP proxy on loopback that the fault scenarios and the soak control: forward, blackhole, reset.

Clients connect to the proxy's port instead of PostgreSQL's. In ``forward`` mode bytes
flow both ways. In ``blackhole`` mode nothing moves in either direction and new
connections are accepted but never answered, as when a network path silently drops
everything: a statement in flight neither completes nor fails, and a new connection
hangs until the client's connect timeout gives up. Bytes that arrived meanwhile stay
queued, as TCP would retransmit them once the path heals. ``reset`` closes every
connection with a TCP RST, as a firewall or NAT that lost its state answers, and then
forwards again.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator

LOOPBACK = "127.0.0.1"
_POLL_SECONDS = 0.1


class FaultProxy:
    """A proxy from a loopback port (``port``, default a free one) to ``upstream``: a
    port on loopback, or the path of a Unix socket."""

    def __init__(self, upstream: int | str, *, port: int = 0) -> None:
        self.upstream = upstream
        self._listener = socket.create_server((LOOPBACK, port))
        self._listener.settimeout(_POLL_SECONDS)
        self.port: int = self._listener.getsockname()[1]
        self._state = threading.Condition()
        self._forwarding = True
        self._closed = False
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept, "fault-proxy-accept")

    # -- control ----------------------------------------------------------------

    def forward(self) -> None:
        """Let bytes flow again, including those held during a blackhole."""
        with self._state:
            self._forwarding = True
            self._state.notify_all()

    def blackhole(self) -> None:
        """Move nothing in either direction, and leave new connections unanswered."""
        with self._state:
            self._forwarding = False

    def reset(self) -> int:
        """Close every connection with a TCP RST, then forward new ones; returns how
        many connections were reset."""
        with self._state:
            links = list(self._links)
            self._links.clear()
            self._forwarding = True
            self._state.notify_all()
        for link in links:
            link.abort()
        return len(links)

    def close(self) -> None:
        """Stop listening and reset every connection."""
        with self._state:
            self._closed = True
            self._state.notify_all()
        self.reset()
        self._listener.close()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        """Connections open through the proxy right now."""
        with self._state:
            return len(self._links)

    # -- moving bytes -----------------------------------------------------------------

    def _spawn(self, target: Callable[..., object], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _wait_forwarding(self, link: _Link) -> bool:
        """Block while the proxy blackholes; False once ``link`` is gone."""
        with self._state:
            while not self._forwarding and not link.closed and not self._closed:
                self._state.wait(_POLL_SECONDS)
            return not link.closed and not self._closed

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            link = _Link(client)
            with self._state:
                self._links.add(link)
            self._spawn(self._connect, "fault-proxy-link", link)

    def _connect(self, link: _Link) -> None:
        # A connection accepted during a blackhole reaches the server only once the path
        # heals (by then its client may long have given up).
        if not self._wait_forwarding(link):
            return
        try:
            link.upstream = _connect(self.upstream)
        except OSError:
            link.abort()
            return
        self._spawn(self._pump, "fault-proxy-up", link, link.client, link.upstream)
        self._pump(link, link.upstream, link.client)

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        try:
            source.settimeout(_POLL_SECONDS)
            while self._wait_forwarding(link):
                try:
                    data = source.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                # Read just as a blackhole began: hold it until the path heals.
                if not self._wait_forwarding(link):
                    return
                target.sendall(data)
        except OSError:
            pass
        link.close()
        with self._state:
            self._links.discard(link)


def _connect(upstream: int | str) -> socket.socket:
    if isinstance(upstream, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            sock.connect(upstream)
        except OSError:
            sock.close()
            raise
        return sock
    return socket.create_connection((LOOPBACK, upstream), timeout=5)


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = False

    def _sockets(self) -> Iterator[socket.socket]:
        yield self.client
        if self.upstream is not None:
            yield self.upstream

    def close(self) -> None:
        """Close both ends normally (FIN)."""
        self.closed = True
        for sock in self._sockets():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def abort(self) -> None:
        """Close both ends with an RST: linger on, timeout zero."""
        self.closed = True
        for sock in self._sockets():
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m pgqueue_bench.infra.proxy --port N --unix PATH``: bring this network namespace's
    loopback up, forward 127.0.0.1:N to the Unix socket PATH, print ``ready``, and run
    until terminated. Started inside a network namespace of its own, it gives processes
    there a TCP path to PostgreSQL that the test can cut for real."""
    import argparse
    import signal
    import subprocess

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix", required=True)
    args = parser.parse_args(argv)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FaultProxy(args.unix, port=args.port):
        print("ready", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
