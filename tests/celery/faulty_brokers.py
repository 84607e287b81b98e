"""Brokers that do not answer, for the deadline tests of both integrations.

:class:`Silent` accepts connections and never sends a byte (a broker that hangs at the
handshake); :class:`Proxy` forwards to a real server until frozen, then holds every byte
(a broker that stops answering with the connection up). Both listen on a free port of
127.0.0.1 and close every socket they opened.
"""

from __future__ import annotations

import select
import socket
import threading


class Silent:
    """A TCP listener that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(connection)

    def close(self) -> None:
        self.sock.close()
        for connection in self.accepted:
            connection.close()


class Proxy:
    """Forwards TCP to ``target`` until :meth:`freeze`; then holds every byte."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sockets: list[socket.socket] = [self.sock]
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen.set()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        while not self.closed.is_set():
            try:
                readable, _, _ = select.select([a, b], [], [], 0.05)
            except (OSError, ValueError):  # closed by close()
                return
            if self.frozen.is_set():
                continue
            for side in readable:
                try:
                    data = side.recv(65_536)
                    if not data:
                        return
                    (b if side is a else a).sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self.closed.set()
        for sock in self.sockets:
            sock.close()
