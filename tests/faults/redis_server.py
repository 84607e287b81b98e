"""Private ``redis-server`` processes for the fault tests, never the shared one on 6379.

Each server listens on a free loopback port, keeps nothing on disk (``--save ""``,
``--appendonly no``), and is stopped or killed by its pid. :meth:`RedisServer.restart`
starts a new, empty server on the same port: a store that lost its memory. A server made
with ``appendonly=True`` logs every write (``--appendonly yes``, written to the kernel
before the reply, so a SIGKILL loses none), and a restart reloads it: a store restarted
with what it held, as a production Redis with persistence is.

A server started with ``replica_of`` (an address: the primary's, or a TCP proxy's in
front of it) replicates it (``--replicaof``); :meth:`RedisServer.promote` makes it a
primary (``REPLICAOF NO ONE``), as a failover does. A replica that lags is one whose link
goes through a proxy that holds the stream (``proxy.pause()``); cutting that link before
the primary is killed (``proxy.drop()``) loses what it held, as a replica lagging behind
a primary that dies does. (``DEBUG SLEEP`` on the replica does not: the stream waits in
its socket and is applied when it wakes.)
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
        self.start_timeout_s = START_TIMEOUT_S
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def answers(self) -> bool:
        raise NotImplementedError

    def _wait_ready(self, log: Path) -> None:
        deadline = time.monotonic() + self.start_timeout_s
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

    def __init__(
        self,
        workdir: Path,
        name: str = "redis",
        *,
        replica_of: tuple[str, int] | None = None,
        appendonly: bool = False,
    ) -> None:
        super().__init__(workdir, name)
        self.replica_of = replica_of
        self.appendonly = appendonly

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
            *("--save", "", "--appendonly", "yes" if self.appendonly else "no"),
            *("--daemonize", "no"),
            *("--dir", str(self.workdir), "--logfile", str(log)),
            *("--repl-diskless-sync-delay", "0"),  # a replica syncs at once, not in 5 s
        ]
        if self.replica_of is not None:
            host, port = self.replica_of
            command += ["--replicaof", host, str(port)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_ready(log)
        return self

    def restart(self) -> None:
        """Kill the server and start a new one on the same port: empty, or with what its
        append-only file logged (``appendonly``)."""
        self.kill()
        self.start()

    def command(self, *args: str | int, timeout: float = 5.0) -> bytes:
        """Send one command and return its first reply line (``+OK``, ``:1``, ...)."""
        return command(self.port, *args, timeout=timeout)

    def promote(self) -> None:
        """``REPLICAOF NO ONE``: this replica becomes a primary, with what it has."""
        reply = self.command("REPLICAOF", "NO", "ONE")
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"{self.name}: REPLICAOF NO ONE answered {reply!r}")

    def wait_in_sync(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until this replica's link to its primary is up (``master_link_status:up``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"master_link_status:up" in info(self.port, "replication"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: not in sync with its primary after {timeout}s")


def _resp(*args: str | int) -> bytes:
    parts = [str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def command(port: int, *args: str | int, timeout: float = 5.0) -> bytes:
    """One command to the server on ``port``: its first reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(_resp(*args))
        return sock.makefile("rb").readline().rstrip(b"\r\n")


def info(port: int, section: str) -> bytes:
    """``INFO section`` of the server on ``port``, as bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_resp("INFO", section))
        reader = sock.makefile("rb")
        size = int(reader.readline()[1:])
        return reader.read(size)


def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server (noeviction, no persistence) for one test, killed by its
    pid: the body of a test module's ``server`` fixture. Skipped when the binary is
    missing, failed instead with ``BEATLESS_REQUIRE_SERVICES=1``."""
    from service_check import require_binary

    if redis_server_binary() is None:
        require_binary("redis-server is not installed")
    started = RedisServer(tmp_path / "redis", "redis").start()
    try:
        yield started
    finally:
        started.kill()


def admin_client(server: RedisServer) -> Iterator[Any]:
    """A redis-py client of ``server`` for the test itself, closed after: the body of an
    ``admin`` fixture."""
    import redis

    client = redis.Redis(port=server.port)
    try:
        yield client
    finally:
        client.close()


class RedisSentinel(PrivateServer):
    """One private Redis Sentinel (``redis-server sentinel.conf --sentinel``) watching the
    primary at ``primary`` as ``service``, alone (quorum 1): it finds the primary's
    replicas itself. ``down_after_ms`` is how long the primary may not answer before the
    sentinel fails over; at 2 s or more a sentinel just started does not think it down
    while its first ``PING`` is on its way."""

    def __init__(
        self,
        workdir: Path,
        primary: tuple[str, int],
        *,
        service: str = "beatless",
        down_after_ms: int = 2_000,
        name: str = "sentinel",
    ) -> None:
        super().__init__(workdir, name)
        self.primary = primary
        self.service = service
        self.down_after_ms = down_after_ms

    def answers(self) -> bool:
        return ping(self.port)

    def start(self) -> RedisSentinel:
        """Write the sentinel's config (it rewrites it as it learns) and start it."""
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.starts += 1
        log = self.workdir / f"{self.name}.log"
        config = self.workdir / f"{self.name}.conf"
        host, port = self.primary
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndaemonize no\n"
            f'dir "{self.workdir}"\nlogfile "{log}"\n'
            f"sentinel monitor {self.service} {host} {port} 1\n"
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.service} 10000\n"
        )
        self.process = subprocess.Popen(
            [binary, str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_ready(log)
        return self

    def url(self, db: int = 0) -> str:
        """The ``redis+sentinel://`` store URL of the service."""
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}/{db}"

    def log(self) -> str:
        """The end of the sentinel's log, for a failure message."""
        path = self.workdir / f"{self.name}.log"
        return path.read_text(errors="replace")[-3_000:] if path.exists() else ""

    def ask(self, *args: str) -> Any:
        """One ``SENTINEL`` command, its reply parsed by redis-py."""
        import redis

        client = redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)
        try:
            return client.execute_command("SENTINEL", *args)
        finally:
            client.close()

    def master_port(self) -> int:
        """The port of the master the sentinel names now."""
        _host, port = self.ask("GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)

    def knows_a_good_replica(self) -> bool:
        """Whether the sentinel would fail over now: the master is up and a replica in
        sync was heard from lately (``SENTINEL FAILOVER`` answers ``NOGOODSLAVE`` before)."""
        import redis

        client = redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)
        try:
            master = client.sentinel_master(self.service)
            replicas = client.sentinel_slaves(self.service)
        finally:
            client.close()
        return "s_down" not in str(master.get("flags", "")) and any(
            r.get("master-link-status") == "ok" and int(r.get("info-refresh", 1e9)) < 5_000
            for r in replicas
        )

    def wait_until(self, done: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {what} after {timeout} s:\n{self.log()}")
            time.sleep(0.05)


@contextlib.contextmanager
def sentinel_group(
    workdir: Path, *, service: str = "beatless", ready_s: float = START_TIMEOUT_S
) -> Iterator[tuple[RedisServer, RedisServer, RedisSentinel]]:
    """A primary, its replica and a sentinel watching them as ``service``, once the
    sentinel could fail over; every process killed by its pid at the end."""
    primary = RedisServer(workdir / "primary", "primary")
    replica = RedisServer(workdir / "replica", "replica", replica_of=primary.address)
    sentinel = RedisSentinel(workdir / "sentinel", primary.address, service=service)
    try:
        primary.start()
        replica.start()
        replica.wait_in_sync(ready_s)
        sentinel.start()
        sentinel.wait_until(sentinel.knows_a_good_replica, "no replica found", ready_s)
        yield primary, replica, sentinel
    finally:
        for server in (sentinel, replica, primary):
            server.kill()
