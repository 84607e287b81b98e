"""A :class:`Wake` that only records what it is told, for tests and for one-off
dispatches outside the loop (:func:`beatless.node.dispatch.dispatch_now`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from beatless.schedule.firing import Firing
    from beatless.stores.base import Note, NoteItem


class Recorder:
    """A :class:`Wake` that only records what it is told: for tests and one-off dispatches
    outside the loop (nothing is retried; ``held`` firings are not rechecked)."""

    def __init__(self, node: str, clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.live_revision: int | None = None
        self.clock = clock
        self.outcomes: dict[str, str] = {}
        self.held: set[str] = set()
        self.built: dict[str, object] = {}
        """What :meth:`Dispatcher.prepare` built, by firing id, to hand back once."""
        self.failures: list[tuple[str, str, Exception]] = []
        """Steps after a send that failed: ``(firing id, step, error)``."""
        self.window: list[str] = []
        """Sent firings whose commit found them taken over (:meth:`Wake.in_window`)."""

    def now_ms(self) -> int:
        return math.floor(self.clock() * 1_000)

    def is_late(self, firing: Firing, ahead_ms: int = 0) -> bool:
        return self.now_ms() + ahead_ms - firing.occurrence_ms > firing.entry.max_late_ms

    def until_release(self) -> None:
        """Nothing to wait for: a dispatch outside the loop is of firings released."""

    def was_held(self, firing: Firing) -> bool:
        return firing.id in self.held

    def decide(self, firing: Firing, outcome: str, *, recorded: bool = False) -> None:
        self.outcomes[firing.id] = outcome

    def retry(self, firing: Firing, outcome: str, *, requeue: bool = True) -> None:
        self.outcomes[firing.id] = outcome

    def sent(self, firing: Firing, outcome: str) -> None:
        self.outcomes[firing.id] = outcome

    def failed_after_send(self, firings: Sequence[Firing], step: str, exc: Exception) -> None:
        self.failures += [(f.id, step, exc) for f in firings]

    def in_window(self, firings: Sequence[Firing]) -> None:
        self.window += [f.id for f in firings]

    def prepared(self, firing: Firing) -> object | None:
        return self.built.pop(firing.id, None)

    def history_notes(self, decided: Sequence[tuple[Firing, str]]) -> list[Note]:
        return []

    def history_template(self, firing: Firing) -> Note | NoteItem | None:
        return None
