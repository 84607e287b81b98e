"""Another client of the claim store's Redis that uses its memory: a cache beside the claims.

A :class:`Writer` writes keys of its own (``pressure:*``, each with a TTL, as a cache
does) at a steady rate in a thread, until :meth:`Writer.stop`. Under an evicting
``maxmemory-policy`` Redis makes room for it by evicting keys, claims included; under
``noeviction`` its writes are refused once Redis is full, and :meth:`Writer.fill` fills
Redis to that point first, so that it stays full while the writer runs.
:meth:`Writer.drain` deletes its keys: the room comes back.
"""

from __future__ import annotations

import threading
import time

import redis

CHUNK = 16_384
"""Bytes per key written."""
TTL_S = 600
"""Every key the writer writes expires after this long: the keys of a cache."""


class Writer:
    """Writes ``rate`` bytes a second of keys of its own into the Redis on ``port``."""

    def __init__(self, port: int, rate: int) -> None:
        self.client = redis.Redis(port=port, socket_timeout=2)
        self.rate = rate
        self.written = 0
        """Keys written."""
        self.refused = 0
        """Writes Redis refused (out of memory)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> bool:
        """Write one key; whether Redis took it."""
        try:
            self.client.set(f"pressure:{self.written}", b"x" * CHUNK, ex=TTL_S)
        except redis.exceptions.OutOfMemoryError:
            self.refused += 1
            return False
        self.written += 1
        return True

    def fill(self, used: int | None = None) -> None:
        """Write as fast as Redis takes it, until it refuses a write (``noeviction``), or
        until its ``used_memory`` reaches ``used`` bytes."""
        while (used is None or self.used_bytes() < used) and self._write():
            pass

    def used_bytes(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def start(self) -> Writer:
        """Write at :attr:`rate` in a thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="pressure", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        began, sent = time.monotonic(), 0
        while not self._stop.is_set():
            self._write()
            sent += CHUNK
            ahead = began + sent / self.rate - time.monotonic()
            if ahead > 0:
                self._stop.wait(ahead)

    def stop(self) -> None:
        """Stop writing (the keys written stay)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def drain(self) -> None:
        """Delete every key the writer wrote."""
        for start in range(0, self.written, 1_000):
            names = [f"pressure:{i}" for i in range(start, min(start + 1_000, self.written))]
            self.client.delete(*names)

    def used(self) -> str:
        """``used_memory`` of the Redis, as it reports it (``7.98M``)."""
        return str(self.client.info("memory")["used_memory_human"])

    def close(self) -> None:
        self.stop()
        self.client.close()
