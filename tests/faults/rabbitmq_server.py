"""A private RabbitMQ node of a test's own, never the shared broker on 5672.

The node runs ``rabbitmq-server`` (the script in ``/usr/lib/rabbitmq/bin``, not the
``/usr/sbin`` wrapper that switches to the ``rabbitmq`` user) under its own node name,
on free loopback ports (AMQP, Erlang distribution, and an ``epmd`` of its own through
``ERL_EPMD_PORT``, started in the foreground as a child of the test and killed by its
pid, so the shared broker's ``epmd`` on 4369 is never asked), with its
data, logs, configuration, plugins file and Erlang cookie (``HOME``) in the test's
directory. It is started with a bounded wait (:data:`START_TIMEOUT_S`) and killed by
its pid.

:meth:`RabbitMQServer.ctl` runs ``rabbitmqctl -n NODE`` against it: a memory alarm is
``set_vm_memory_high_watermark absolute 1``; :meth:`RabbitMQServer.clear_alarm` puts
the watermark back. Each ``rabbitmqctl`` starts an Erlang VM of its own, 4 to 10 s on a
loaded 2-core machine, so an alarm that must last a given time is cleared by the node
itself (:meth:`RabbitMQServer.raise_alarm_for`), not by a second ``rabbitmqctl``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path

from ports import free_port
from redis_server import PrivateServer

START_TIMEOUT_S = 60.0
"""A RabbitMQ node boots in 5 to 15 s on a busy 2-core machine."""
CTL_TIMEOUT_S = 30.0
SCRIPTS = Path("/usr/lib/rabbitmq/bin")


def rabbitmq_server_binary() -> str | None:
    """The path of the ``rabbitmq-server`` script (not the root wrapper), or ``None``."""
    script = SCRIPTS / "rabbitmq-server"
    if script.exists():
        return str(script)
    return shutil.which("rabbitmq-server")


class RabbitMQServer(PrivateServer):
    """One private RabbitMQ node: :meth:`start`, :meth:`ctl`, :meth:`stop`."""

    def __init__(self, workdir: Path, name: str = "rabbitmq") -> None:
        super().__init__(workdir, name)
        self.start_timeout_s = START_TIMEOUT_S
        self.node = f"beatless{uuid.uuid4().hex[:8]}@localhost"
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def answers(self) -> bool:
        """True when the node accepts an AMQP connection and says its protocol header."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                return sock.recv(8).startswith(b"\x01\x00\x00")  # Connection.Start
        except OSError:
            return False

    def env(self) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        return {
            **os.environ,
            "HOME": str(home),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_LOGS": str(self.workdir / "log" / "node.log"),
            "RABBITMQ_PID_FILE": str(self.workdir / "node.pid"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_ENABLED_PLUGINS": "",
        }

    def start(self) -> RabbitMQServer:
        """Start the node and wait (at most :data:`START_TIMEOUT_S`) until it answers."""
        binary = rabbitmq_server_binary()
        if binary is None:
            raise RuntimeError("rabbitmq-server is not installed")
        self.starts += 1
        (self.workdir / "rabbitmq.conf").write_text("loopback_users = none\n")
        (self.workdir / "enabled_plugins").write_text("[].\n")
        log = self.workdir / "start.log"
        epmd = shutil.which("epmd") or "epmd"
        with log.open("ab") as out:
            if self.epmd is None:  # in the foreground, a child of this process
                self.epmd = subprocess.Popen(
                    [epmd, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            self.process = subprocess.Popen(
                [binary], env=self.env(), stdout=out, stderr=subprocess.STDOUT
            )
        self._wait_ready(log)
        return self

    def ctl(self, *args: str) -> str:
        """``rabbitmqctl -n NODE ARGS``: its output; raises when it fails."""
        ctl = SCRIPTS / "rabbitmqctl"
        done = subprocess.run(
            [str(ctl) if ctl.exists() else "rabbitmqctl", "-n", self.node, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=CTL_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def raise_alarm(self) -> None:
        """A memory alarm: the node blocks every connection that publishes."""
        self.ctl("set_vm_memory_high_watermark", "absolute", "1")

    def clear_alarm(self) -> None:
        self.ctl("set_vm_memory_high_watermark", "0.4")

    def raise_alarm_for(self, seconds: float) -> None:
        """A memory alarm that the node clears itself ``seconds`` after raising it (a
        timer of its own, set in the same ``rabbitmqctl eval``): it lasts ``seconds``
        however long ``rabbitmqctl`` takes, and is raised at some instant during this
        call."""
        ms = round(seconds * 1_000)
        self.ctl(
            "eval",
            "vm_memory_monitor:set_vm_memory_high_watermark({absolute, 1}), "
            f"timer:apply_after({ms}, vm_memory_monitor, set_vm_memory_high_watermark, [0.4]), "
            "ok.",
        )

    def kill(self) -> None:
        """SIGKILL the node's Erlang VM by its pid (the start script runs it as a child
        and writes its pid to ``node.pid``), then the script, then stop the node's own
        ``epmd`` (by its port)."""
        pid_file = self.workdir / "node.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
        super().kill()
        epmd, self.epmd = self.epmd, None
        if epmd is not None:
            epmd.kill()
            epmd.wait(5)
