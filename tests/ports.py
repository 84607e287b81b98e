"""Free loopback ports for the servers a test starts, safe when tests run in parallel.

A port found by binding to port 0 comes from Linux's ephemeral range (32768 to 60999),
the range every outgoing connection takes its source port from too: between the probe
and the server's own bind, or while a test restarts a server on the same port, another
test process (a pytest-xdist worker) may be handed that port, or a client's connection
may take it. :func:`free_port` hands out ports below that range instead, from a slice of
:data:`SLICE` ports that belongs to this test process alone (one per pytest-xdist
worker, named by ``PYTEST_XDIST_WORKER``), never the same port twice in a process
before the slice is used up, and only a port that nothing listens on now. A Redis
Cluster node also needs its bus port, the port plus :data:`BUS_OFFSET`, free: that lands
above every slice, where no other port is handed out.
"""

from __future__ import annotations

import os
import random
import socket
import threading

FIRST = 10_000
SLICE = 500
SLICES = 20
"""Ports FIRST to FIRST + SLICES * SLICE - 1 (10000 to 19999): a process out of xdist
takes slice 0, worker ``gwN`` slice N + 1 (modulo SLICES)."""
BUS_OFFSET = 10_000

_lock = threading.Lock()
_next: list[int] = []


def process_slice() -> range:
    """The ports of this test process: its pytest-xdist worker's slice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = int(worker[2:]) + 1 if worker[2:].isdigit() else 0
    start = FIRST + (number % SLICES) * SLICE
    return range(start, start + SLICE)


def bindable(port: int) -> bool:
    """True when nothing on this machine listens on (or is bound to) loopback ``port``."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, also: int | None = None) -> int:
    """A loopback port of this process's slice that is free now and was not handed out
    lately; with ``also``, the port plus ``also`` must be free too."""
    ports = process_slice()
    with _lock:
        if not _next:
            _next.append(random.randrange(len(ports)))  # apart from a concurrent session
        for _ in range(len(ports)):
            port = ports[_next[0] % len(ports)]
            _next[0] += 1
            if bindable(port) and (also is None or bindable(port + also)):
                return port
    raise RuntimeError(f"no free loopback port in {ports.start}-{ports.stop - 1}")
