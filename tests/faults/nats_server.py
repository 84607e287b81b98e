"""A private ``nats-server`` with JetStream for the fault tests, never the shared one on 4222.

The server listens on a free loopback port and keeps its JetStream store in a directory
of the test's own; it is stopped or killed by its pid. :meth:`NatsServer.restart` kills
it (SIGKILL), deletes that store directory and starts a new server on the same port: a
NATS whose JetStream storage was lost, so the claim store's bucket (and its epoch, the
bucket's stream) is gone. :meth:`NatsServer.kill` then :meth:`NatsServer.start` keeps that
directory: a NATS killed and started again with what its JetStream wrote (each message
is written to its file as it is stored, so a SIGKILL loses none).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

from redis_server import PrivateServer

START_TIMEOUT_S = 10.0


def nats_server_binary() -> str | None:
    """The path of ``nats-server`` (Debian installs it in ``/usr/sbin``), or ``None``."""
    return shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin")


def jetstream_ready(port: int, timeout: float = 0.5) -> bool:
    """True when a NATS server on ``port`` greets with an ``INFO`` saying JetStream is on."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            greeting = sock.recv(8_192)
    except OSError:
        return False
    if not greeting.startswith(b"INFO "):
        return False
    try:
        info = json.loads(greeting[5:].split(b"\r\n", 1)[0])
    except ValueError:
        return False
    return bool(info.get("jetstream"))


class NatsServer(PrivateServer):
    """One private ``nats-server -js``: start, kill, restart (empty), stop."""

    def __init__(self, workdir: Path, name: str = "nats") -> None:
        super().__init__(workdir, name)
        self.store_dir = workdir / "jetstream"

    def url(self, query: str = "") -> str:
        return f"nats://127.0.0.1:{self.port}/" + (f"?{query}" if query else "")

    def answers(self) -> bool:
        return jetstream_ready(self.port)

    def start(self) -> NatsServer:
        """Start the server on :attr:`port` and wait until it answers with JetStream on."""
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("nats-server is not installed")
        self.starts += 1
        log = self.workdir / f"{self.name}.log"
        command = [
            binary,
            *("-a", "127.0.0.1", "-p", str(self.port)),
            *("-js", "-sd", str(self.store_dir)),
        ]
        with log.open("ab") as out:
            out.write(f"--- start {self.starts}: {' '.join(command)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self._wait_ready(log)
        return self

    def restart(self) -> None:
        """Kill the server, delete its JetStream store, start a new one on the same port."""
        self.kill()
        shutil.rmtree(self.store_dir, ignore_errors=True)
        self.start()
