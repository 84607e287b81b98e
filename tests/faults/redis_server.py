"""Private ``redis-server`` processes for the fault tests, never the shared one on 6379.

Each server listens on a free loopback port, keeps nothing on disk (``--save ""``,
``--appendonly no``), and is stopped or killed by its pid. :meth:`RedisServer.restart`
starts a new, empty server on the same port: a store that lost its memory.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ports import free_port

START_TIMEOUT_S = 10.0


def redis_server_binary() -> str | None:
    """The path of ``redis-server``, or ``None`` when it is not installed."""
    return shutil.which("redis-server")


def ping(port: int, timeout: float = 0.5) -> bool:
    """True when a Redis server on ``port`` answers ``PING``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class PrivateServer:
    """A server process of a test's own on a free loopback port, stopped or killed by its
    pid; subclasses say how to start it (:meth:`start`) and when it answers
    (:meth:`answers`)."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.workdir = workdir
        self.name = name
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def answers(self) -> bool:
        raise NotImplementedError

    def _wait_ready(self, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.answers():
                return
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.05)
        tail = log.read_text(errors="replace")[-2_000:] if log.exists() else ""
        self.kill()
        raise RuntimeError(f"{self.name} did not start on port {self.port}:\n{tail}")

    def kill(self) -> None:
        """SIGKILL the server by its pid."""
        self._signal_and_wait(signal.SIGKILL, timeout=5)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a few seconds)."""
        self._signal_and_wait(signal.SIGTERM, timeout=5)
        self.kill()

    def _signal_and_wait(self, signum: int, timeout: float) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)


class RedisServer(PrivateServer):
    """One private ``redis-server``: :meth:`start`, :meth:`kill`, :meth:`restart`, :meth:`stop`."""

    def __init__(self, workdir: Path, name: str = "redis") -> None:
        super().__init__(workdir, name)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def answers(self) -> bool:
        return ping(self.port)

    def start(self) -> RedisServer:
        """Start the server on :attr:`port` and wait until it answers."""
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.starts += 1
        log = self.workdir / f"{self.name}.log"
        command = [
            binary,
            *("--port", str(self.port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--daemonize", "no"),
            *("--dir", str(self.workdir), "--logfile", str(log)),
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_ready(log)
        return self

    def restart(self) -> None:
        """Kill the server and start a new, empty one on the same port."""
        self.kill()
        self.start()
