"""The connections of one store object: one for each call under way at once.

A node calls its store from two threads: its loop claims and commits the firings it
sends, whose leases are running, while its board syncs the registry and the history and
claims missed-firing markers, a long call after a pause. Were every call made on one
connection, one at a time, a commit could wait behind its own board's call past its
lease, and another node would take the firing over and send it too. So a call takes a
connection that no other call is using, and a store object keeps as many as it made
calls at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from beatless.errors import StoreError

T = TypeVar("T")


CLOSE_WAIT_S = 10.0
"""How long :meth:`Pool.close` waits for the calls under way to end."""


class Pool(Generic[T]):
    """The connections of one store object, made by ``make`` and closed by ``close``.

        :meth:`take` lends a call the connection used last that no other call is using, or a
        new one when every one is busy; the call gives it back when it ends. ``limit`` caps
        how many there are (``None``: no cap): a call past it waits for one to come back.
        What ``make`` returns is the store's holder of a connection, which it opens at first
        use and opens again after a failure: making one never fails. ``name`` names the store
        in the error of a closed one (``"postgres store postgresql://..."``).

        :meth:`close` closes the idle connections; one in use is closed when its call ends,
    which :meth:`close` waits for (up to :data:`CLOSE_WAIT_S`). A
        child process that inherits the pool forgets every connection without closing it:
        their sockets belong to the parent. Thread-safe.
    """

    def __init__(
        self,
        make: Callable[[], T],
        close: Callable[[T], None],
        *,
        name: str,
        limit: int | None = None,
    ) -> None:
        self._make, self._close = make, close
        self._name, self._limit = name, limit
        self._cond = threading.Condition()
        self._pid = os.getpid()
        self._closed = False
        self._count = 0
        """The connections made and not closed, idle or in use."""
        self.idle: list[T] = []
        """The connections no call is using, the last used at the end."""

    @property
    def count(self) -> int:
        """How many connections the pool holds, idle or in use."""
        return self._count

    @contextmanager
    def take(self) -> Iterator[T]:
        """A connection of this call's own, given back when the block ends."""
        if self._pid != os.getpid():
            self._forget()  # before the lock, which the parent may have held at the fork
        with self._cond:
            while True:
                if self._closed:
                    raise StoreError(f"{self._name} is closed")
                if self.idle:
                    item = self.idle.pop()
                    break
                if self._limit is None or self._count < self._limit:
                    item = self._make()
                    self._count += 1
                    break
                self._cond.wait()
        try:
            yield item
        finally:
            self._give_back(item)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Close the idle connections, and each one in use once its call ends; wait up to
        ``wait_s`` for those calls, so that what follows a close (a schema dropped, a
        server stopped) does not race a call still under way."""
        with self._cond:
            self._closed = True
            idle, self.idle = self.idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        if self._pid != os.getpid():
            return
        for item in idle:
            self._close(item)
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._count > 0 and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)

    def _give_back(self, item: T) -> None:
        with self._cond:
            if not self._closed:
                self.idle.append(item)
                self._cond.notify()
                return
        self._close(item)
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def _forget(self) -> None:
        self._cond = threading.Condition()
        self._pid, self.idle, self._count = os.getpid(), [], 0
