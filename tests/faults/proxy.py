"""A threaded TCP proxy for fault tests: pass bytes through, hold them, or cut the link.

The proxy listens on a free loopback port and forwards every connection to one target.
The test controls it while nodes talk through it:

* :meth:`Proxy.resume` (the initial state): bytes flow both ways as they arrive;
* :meth:`Proxy.pause`: every byte is read and held, in both directions, on every
  connection (new ones too); :meth:`Proxy.resume` delivers them late, in order. A
  client that gives up meanwhile still has its request delivered, late, to the server:
  the "claim that travels, or waits in a client queue" of the timing page;
* :meth:`Proxy.drop`: every connection is cut (bytes held are lost) and new ones are
  reset at once, until :meth:`Proxy.resume`.

Each connection has two pump threads; :meth:`Proxy.close` ends and joins them all.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType

POLL_S = 0.05
"""How often a pump looks at the proxy's state while it waits for bytes."""
MAX_HELD = 16 * 1024 * 1024
"""A pump holds at most this many bytes; past that it stops reading (TCP pushes back)."""
CHUNK = 65_536


class _Link:
    """One proxied connection: the client's socket and the one opened to the target."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.cut = threading.Event()
        self._pumps_left = 2
        self._lock = threading.Lock()

    def cut_off(self) -> None:
        """Cut both sockets now: the pumps wake up, find the link cut and exit."""
        self.cut.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def pump_done(self) -> bool:
        """Called by each pump as it exits; true for the last one, which closes both."""
        with self._lock:
            self._pumps_left -= 1
            last = self._pumps_left == 0
        if last:
            for sock in (self.client, self.upstream):
                if self.cut.is_set():
                    _reset_and_close(sock)
                else:
                    sock.close()
        return last


class Proxy:
    """A TCP proxy from ``127.0.0.1:{port}`` to ``target``; see the module docstring."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1") -> None:
        self.target = target
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(POLL_S)
        self.host, self.port = self._listener.getsockname()[:2]
        self._flowing = threading.Event()
        self._flowing.set()
        self._dropping = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop, "accept")

    @property
    def url(self) -> str:
        """A ``redis://`` URL through the proxy (database 0)."""
        return f"redis://{self.host}:{self.port}/0"

    # -- control ------------------------------------------------------------------------

    def pause(self) -> None:
        """Hold every byte in both directions until :meth:`resume`."""
        self._flowing.clear()

    def drop(self) -> None:
        """Cut every connection and reset new ones until :meth:`resume`."""
        self._dropping.set()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.cut_off()

    def resume(self) -> None:
        """Let bytes flow again; bytes held by a pause are delivered now."""
        self._dropping.clear()
        self._flowing.set()

    def tell_clients(self, data: bytes) -> None:
        """Send ``data`` to the client of every connection as if the target had sent it,
        between two of the target's messages: the target's bytes are held meanwhile (a
        pause of two polls, so that no send of theirs is under way), then flow again.
        For a notice a server sends on its own, such as AMQP's ``Connection.Blocked``. A
        proxy paused before stays paused."""
        flowing = self._flowing.is_set()
        self.pause()
        time.sleep(2 * POLL_S)
        with self._lock:
            links = list(self._links)
        for link in links:
            link.client.sendall(data)
        if flowing:
            self.resume()

    def close(self) -> None:
        """Stop accepting, cut every connection and join every thread."""
        self._closed.set()
        self._flowing.set()
        self.drop()
        with contextlib.suppress(OSError):
            self._listener.close()
        for thread in list(self._threads):
            thread.join(timeout=2)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- threads ------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(
            target=target, args=args, name=f"proxy-{self.port}-{name}", daemon=True
        )
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._dropping.is_set() or self._closed.is_set():
                _reset_and_close(client)
                continue
            self._open_link(client)

    def _open_link(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            _reset_and_close(client)
            return
        upstream.settimeout(None)
        link = _Link(client, upstream)
        with self._lock:
            self._links.add(link)
        if self._dropping.is_set():  # a drop began while this link was being opened
            link.cut_off()
        self._spawn(self._pump, "up", link, client, upstream)
        self._spawn(self._pump, "down", link, upstream, client)

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        """Move bytes from ``src`` to ``dst``, holding them while the proxy is paused."""
        held = bytearray()
        at_eof = False
        try:
            while not (link.cut.is_set() or self._closed.is_set()):
                if held and self._flowing.is_set():
                    dst.sendall(held)
                    held.clear()
                if at_eof and not held:
                    dst.shutdown(socket.SHUT_WR)
                    break
                if at_eof or len(held) >= MAX_HELD:
                    self._flowing.wait(POLL_S)
                    continue
                at_eof = self._read_into(src, held)
        except OSError:
            link.cut_off()
        finally:
            if link.pump_done():
                with self._lock:
                    self._links.discard(link)

    @staticmethod
    def _read_into(src: socket.socket, held: bytearray) -> bool:
        """Append what ``src`` has to ``held`` (waiting at most one poll); true at EOF."""
        ready, _, _ = select.select([src], [], [], POLL_S)
        if not ready:
            return False
        data = src.recv(CHUNK)
        held.extend(data)
        return not data


def _reset_and_close(sock: socket.socket) -> None:
    """Close with a reset rather than a graceful FIN: the peer sees the link cut."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
