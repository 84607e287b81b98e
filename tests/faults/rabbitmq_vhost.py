"""A RabbitMQ virtual host of the test's own on the shared broker, made with ``rabbitmqctl``.

The RabbitMQ store keeps everything it knows in one virtual host: its slots (queues),
its commits (bindings to its exchange) and its epoch record (a queue and a binding). A
broker that lost its definitions (its node reset, or restarted without its Mnesia or
Khepri data) has none of them. :meth:`Vhost.restart` does that to the test's own
virtual host only: ``rabbitmqctl delete_vhost`` (the broker closes every connection to
it and drops its queues, exchanges and bindings), then ``add_vhost`` and
``set_permissions`` again, empty. Nothing else on the shared broker is touched.
"""

from __future__ import annotations

import shutil
import subprocess
from urllib.parse import quote

CTL_TIMEOUT_S = 60.0
GUEST = "guest"
"""RabbitMQ's default user and password, as the shared broker of the tests has them."""


def rabbitmqctl_binary() -> str | None:
    """The path of ``rabbitmqctl`` (Debian installs it in ``/usr/sbin``), or ``None``."""
    return shutil.which("rabbitmqctl") or shutil.which("rabbitmqctl", path="/usr/sbin")


class VhostError(RuntimeError):
    """``rabbitmqctl`` refused or failed (not installed, no right to the broker's cookie)."""


class Vhost:
    """One virtual host of the test's own: :meth:`create`, :meth:`delete`, :meth:`restart`."""

    def __init__(self, name: str, *, user: str = GUEST, password: str = GUEST) -> None:
        self.name = name
        self.user = user
        self.password = password
        self.exists = False
        self.restarts = 0

    def url(self, host: str = "127.0.0.1", port: int = 5672, query: str = "") -> str:
        vhost = quote(self.name, safe="")
        return f"amqp://{self.user}:{self.password}@{host}:{port}/{vhost}" + (
            f"?{query}" if query else ""
        )

    def create(self) -> Vhost:
        """Add the virtual host and give :attr:`user` every right in it."""
        self._ctl("add_vhost", self.name)
        self.exists = True
        self._ctl("set_permissions", "-p", self.name, self.user, ".*", ".*", ".*")
        return self

    def delete(self) -> None:
        """Delete the virtual host and everything in it (only if this object made it)."""
        if self.exists:
            self._ctl("delete_vhost", self.name)
            self.exists = False

    def restart(self) -> None:
        """Delete the virtual host and make it again, empty."""
        self.restarts += 1
        self.delete()
        self.create()

    def _ctl(self, *args: str) -> None:
        binary = rabbitmqctl_binary()
        if binary is None:
            raise VhostError("rabbitmqctl is not installed")
        try:
            done = subprocess.run(
                [binary, *args], capture_output=True, text=True, timeout=CTL_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise VhostError(f"rabbitmqctl {' '.join(args)}: {exc}") from None
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip()[-1_000:]
            raise VhostError(f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): {output}")
