"""A private PostgreSQL server for the fault tests, never the shared one on 5432.

A PostgreSQL claim store loses its memory when the nodes fail over to a replica that had
not received the store's schema yet, or when the database is restored from a backup
older than it: the nodes reconnect to a server on the same address that knows nothing
of their claims or their epoch. The fault tests do that for real, on a cluster of their
own: ``initdb`` in a temporary directory, ``postgres`` on a free loopback port, and
:meth:`PostgresServer.restart` SIGKILLs the postmaster and its children by pid, deletes
the data directory, runs ``initdb`` again and starts a new, empty server on the same port.
:meth:`PostgresServer.kill` then :meth:`PostgresServer.start` keeps the data directory:
the server recovers from its WAL, as a crashed PostgreSQL does (with the settings
:data:`DURABLE`, each commit is in the kernel before it returns, so the SIGKILL loses no
committed transaction).

This is preferred to dropping the test's schema on the shared server (the other way to
make the store forget) because it also cuts every node's connection, mid-call or idle,
as a failover does, and because it costs little: on the 2-core machine the suite was
written on, ``initdb`` takes about 0.6 s and the server answers 0.1 s after it starts.

PostgreSQL refuses to run as root. A test run by root runs ``initdb`` and ``postgres``
as the ``postgres`` OS user (``subprocess`` switches the user in the child, as
``runuser`` would, so the pid the test holds is the server's own), in a directory made
with :func:`tempfile.mkdtemp` and given to that user: pytest's ``tmp_path`` lies under a
directory only its owner may enter. A test run by another user runs them as itself. The
server's log goes to the test's ``tmp_path``, written through a file the test opened.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from redis_server import free_port

START_TIMEOUT_S = 15.0
INITDB_TIMEOUT_S = 60.0
DEBIAN_ROOT = Path("/usr/lib/postgresql")
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    # Nothing it writes must survive a crash of the machine (nor, but with DURABLE, of
    # the server: a restart empty deletes the data directory anyway).
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # Kept in the data directory, so a killed server leaves nothing in /dev/shm.
    "dynamic_shared_memory_type": "mmap",
    "max_connections": "40",
}
DURABLE = {"synchronous_commit": "on"}
"""Settings over :data:`SERVER_SETTINGS` for a server whose restart keeps its data."""


def postgres_bindir() -> Path | None:
    """The directory of ``initdb`` and ``postgres``: the newest Debian-style
    ``/usr/lib/postgresql/N/bin``, else the one ``initdb`` is found in on ``PATH``."""
    candidates = sorted(
        (p for p in DEBIAN_ROOT.glob("*/bin") if p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    found = shutil.which("initdb")
    if found is not None:
        candidates.append(Path(found).parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "postgres").exists():
            return bindir
    return None


def unavailable() -> str | None:
    """Why a private server cannot be run here, or ``None`` if it can."""
    if postgres_bindir() is None:
        return "PostgreSQL's initdb and postgres are not installed"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no 'postgres' OS user to run PostgreSQL as"
    return None


class PostgresServer:
    """One private PostgreSQL cluster: start, kill, restart (empty), stop."""

    def __init__(self, logdir: Path, name: str = "postgres") -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL's initdb and postgres are not installed")
        self.bindir = bindir
        self.name = name
        self.log = logdir / f"{name}.log"
        self.port = free_port()
        self.workdir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.postmasters: list[int] = []
        """Every postmaster pid this object started: the SysV segments it may leave."""
        self.starts = 0
        self.settings = dict(SERVER_SETTINGS)
        """The server's settings (``-c``) from its next start."""
        logdir.mkdir(parents=True, exist_ok=True)

    def url(self, query: str = "") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres" + (
            f"?{query}" if query else ""
        )

    @property
    def data(self) -> Path:
        assert self.workdir is not None, "start the server first"
        return self.workdir / "data"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> PostgresServer:
        """``initdb`` a new cluster if there is none, start it on :attr:`port`, and wait
        until it answers a query."""
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="beatless-faults-pg-"))
            self._give(self.workdir)
        if not self.data.exists():
            self._initdb()
        self.starts += 1
        command = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        command += ["-k", str(self.workdir)]
        for key, value in self.settings.items():
            command += ["-c", f"{key}={value}"]
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts} on port {self.port}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir, **self._user()
            )
        self.postmasters.append(self.process.pid)
        self._wait_ready()
        return self

    def _initdb(self) -> None:
        command = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres"]
        command += ["--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"]
        with self.log.open("ab") as out:
            out.write(b"--- initdb\n")
            out.flush()
            done = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                timeout=INITDB_TIMEOUT_S,
                check=False,
                **self._user(),
            )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{self._tail()}")

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.url(), connect_timeout=1) as conn:
                    conn.execute("SELECT 1")
                    return
            except psycopg.Error:
                pass
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.name} did not start on port {self.port}:\n{self._tail()}")

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, by pid: all it held in
        memory is lost (its data directory stays as it was)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        # Stopped, the postmaster can neither start a process nor reap one, so the pids
        # of its children stay theirs (as zombies at worst) until it is killed too.
        os.kill(process.pid, signal.SIGSTOP)
        children = _children_of(process.pid)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        process.kill()
        process.wait(10)
        _wait_gone(children, timeout=10)
        self._remove_segments()

    def restart(self) -> None:
        """Kill the server, delete its cluster, ``initdb`` a new one, start it on the
        same port."""
        self.kill()
        shutil.rmtree(self.data, ignore_errors=True)
        self.start()

    def stop(self) -> None:
        """Kill the server and delete its directory (the log stays in the test's)."""
        try:
            self.kill()
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _user(self) -> dict[str, Any]:
        """``subprocess`` arguments that run the child as the ``postgres`` user, if root."""
        if os.geteuid() != 0:
            return {}
        user = pwd.getpwnam("postgres")
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def _give(self, path: Path) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(path, user.pw_uid, user.pw_gid)

    def _remove_segments(self) -> None:
        """Remove the System V shared memory segments that our killed postmasters created
        (a killed server cannot remove its own), and no others."""
        if shutil.which("ipcs") is None or shutil.which("ipcrm") is None:
            return
        listing = subprocess.run(
            ["ipcs", "-m", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        ours = {str(pid) for pid in self.postmasters}
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[0].isdigit() and fields[2] in ours:
                subprocess.run(["ipcrm", "-m", fields[0]], capture_output=True, check=False)

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2_000:] if self.log.exists() else ""


def _children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from ``/proc``)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                children.append(int(stat.parent.name))
    return children


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Wait until none of ``pids`` runs any more (a zombie has ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_running(pid) for pid in pids):
            return
        time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
