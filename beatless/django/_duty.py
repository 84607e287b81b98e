"""The poll duty: one node of the fleet polls the Django database each half second.

No leader: each half second ``s`` (a multiple of ``POLL_MS`` since the epoch) is a firing
of the address ``{namespace}/.django/poll``, claimed with the store's own exactly-once
claim, and only the node that wins it polls
(:meth:`beatless.django._bridge.Bridge.poll`), so one node reads the Django database at
a time and the others never touch it. Which node claims is the preferred claimer's
choice (:mod:`beatless.node._prefer`): the node ranked first for that instant's firing
claims at ``s``, the second at ``s + BACKUP_MS`` (it loses when the first polled), the
others not at all while those two are in the registry. The poll at the start of every
``hash_every``-th second (by the second's number, the same on every node) is a full
pass: every row read and compared.

Why a half second: an edit is in force at the fence of the revision that publishes it,
two seconds after that revision's commit (:mod:`beatless.live`), so the time from
``save()`` to in force is the wait for the next poll, the poll, and those two seconds.
Polled each second, the worst case was three seconds and more; each half second it is
about two and a half, for one more cheap query a second (the markers:
:class:`~beatless.django._orm.Probe`).
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

POLL_MS = 500
"""How often the fleet polls: one node each time."""
BACKUP_MS = 250
"""How long after its instant the node ranked second claims a poll."""
MAX_LATE_MS = 5_000
LEASE_MS = 10_000
MEMORY_MS = 30_000
"""How long the store remembers a poll's claim: past its lateness, so a second is polled
once."""
HASH_EVERY_S = 60
WARN_EVERY_S = 60.0


class PollDuty:
    """The poll thread of one node: claims each half second's poll as the preference says and
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
        """Polls this node won and made."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = 0.0

    def rank(self, instant_ms: int) -> int:
        """This node's place for the poll at ``instant_ms`` (0: first)."""
        view = self.view()
        if view is None or self.node not in view.nodes or len(view.nodes) == 1:
            return 0
        return view.rank(firing_id(self.address, instant_ms), self.node)[0]

    def turn(self, instant_ms: int) -> bool:
        """Claim the poll of ``instant_ms`` and, when won, poll; whether this node polled."""
        request = ClaimRequest(
            id=firing_id(self.address, instant_ms),
            address=self.address,
            occurrence_ms=instant_ms,
            max_late_ms=MAX_LATE_MS,
            memory_ms=MEMORY_MS,
            release_ms=instant_ms,
        )
        if not self.store.claim([request], node=self.node, lease_ms=LEASE_MS)[0].is_won:
            return False
        whole = instant_ms % 1_000 == 0
        try:
            self.bridge.poll(full=whole and (instant_ms // 1_000) % self.hash_every_s == 0)
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
            instant = (int(self.clock() * 1_000) // POLL_MS + 1) * POLL_MS
            rank = self.rank(instant)
            if self._sleep_until(instant + (rank * BACKUP_MS if rank <= 1 else 0)):
                return
            try:
                if rank <= 1:
                    self.turn(instant)
                if instant % 1_000 == 0:
                    self.each_second()
            except Exception as exc:  # a database or store error costs this poll only
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
            "beatless: the django-celery-beat poll failed (tried again at the next poll; said "
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
