"""The poll duty: one node of the fleet polls the Django database each second.

No leader: each second ``s`` is a firing of the address ``{namespace}/.django/poll``,
claimed with the store's own exactly-once claim, and only the node that wins it polls
(:meth:`beatless.django._bridge.Bridge.poll`), so one node reads the Django database
per second and the others never touch it. Which node claims is the preferred claimer's
choice (:mod:`beatless.node._prefer`): the node ranked first for that second's firing
claims at ``s``, the second at ``s + BACKUP_MS`` (it loses when the first polled), the
others not at all while those two are in the registry. The poll of every
``hash_every``-th second (by the second's number, the same on every node) is a full
pass: every row read and compared.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.django._bridge import Bridge
from beatless.node._prefer import View
from beatless.schedule.firing import firing_id
from beatless.stores.base import ClaimRequest, ClaimStore

logger = logging.getLogger(__name__)

BACKUP_MS = 400
"""How long after the second the node ranked second claims it."""
MAX_LATE_MS = 5_000
LEASE_MS = 10_000
MEMORY_MS = 30_000
"""How long the store remembers a poll's claim: past its lateness, so a second is polled
once."""
HASH_EVERY_S = 60
WARN_EVERY_S = 60.0


class PollDuty:
    """The poll thread of one node: claims each second's poll as the preference says and
    polls when it wins. ``view`` gives the node's current view of the fleet (``None``:
    this node alone)."""

    def __init__(
        self,
        bridge: Bridge,
        store: ClaimStore,
        *,
        node: str,
        namespace: str,
        view: Callable[[], View | None] = lambda: None,
        clock: Callable[[], float] = time.time,
        hash_every_s: int = HASH_EVERY_S,
        close: Callable[[], None] = lambda: None,
        each_second: Callable[[], object] = lambda: None,
    ) -> None:
        if not isinstance(hash_every_s, int) or hash_every_s < 1:
            raise ValueError(f"hash_every must be a whole number of seconds, got {hash_every_s!r}")
        self.bridge = bridge
        self.store = store
        self.node = node
        self.address = f"{namespace}/.django/poll"
        self.view = view
        self.clock = clock
        self.hash_every_s = hash_every_s
        self.close = close
        self.each_second = each_second
        """Called by the thread once a second, whether this node polled or not (the
        write-back of :mod:`beatless.django._writeback`)."""
        """Called by the thread as it ends: closes its connections to the database."""
        self.polls = 0
        """Seconds this node won and polled."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = 0.0

    def rank(self, second_ms: int) -> int:
        """This node's place for the poll of ``second_ms`` (0: first)."""
        view = self.view()
        if view is None or self.node not in view.nodes or len(view.nodes) == 1:
            return 0
        return view.rank(firing_id(self.address, second_ms), self.node)[0]

    def turn(self, second_ms: int) -> bool:
        """Claim the poll of ``second_ms`` and, when won, poll; whether this node polled."""
        request = ClaimRequest(
            id=firing_id(self.address, second_ms),
            address=self.address,
            occurrence_ms=second_ms,
            max_late_ms=MAX_LATE_MS,
            memory_ms=MEMORY_MS,
            release_ms=second_ms,
        )
        if not self.store.claim([request], node=self.node, lease_ms=LEASE_MS)[0].is_won:
            return False
        try:
            self.bridge.poll(full=(second_ms // 1_000) % self.hash_every_s == 0)
            self.polls += 1
        finally:
            self.store.commit([request.id], node=self.node)
        return True

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            second = (int(self.clock() * 1_000) // 1_000 + 1) * 1_000
            rank = self.rank(second)
            if rank > 1:
                if self._sleep_until(second):
                    return
                try:
                    self.each_second()
                except Exception as exc:
                    self._warn(exc)
                continue
            if self._sleep_until(second + rank * BACKUP_MS):
                return
            try:
                self.turn(second)
                self.each_second()
            except Exception as exc:  # a database or store error costs this second only
                self._warn(exc)

    def _sleep_until(self, instant_ms: int) -> bool:
        """Wait until ``instant_ms`` on the clock; whether the duty was stopped."""
        return self._stop.wait(max(0.0, instant_ms / 1_000 - self.clock()))

    def _warn(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._warned < WARN_EVERY_S:
            logger.debug("beatless django poll failed: %r", exc)
            return
        self._warned = now
        logger.warning(
            "beatless: the django-celery-beat poll failed (tried again next second; said "
            "once a minute): %s",
            shown(f"{type(exc).__name__}: {exc}", quoted=False, limit=ERROR_LIMIT),
        )

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(
            target=self.run, name=f"beatless-django-{self.node}", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
