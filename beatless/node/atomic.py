"""Claim and enqueue in one script on the broker's own Redis: the skeleton of the atomic path.

When the claim store is the broker's own Redis, a won firing's message is pushed by the
claim script itself (:meth:`RedisStore.claim_and_push
<beatless.stores.redis.store.RedisStore.claim_and_push>`): the firing is in the queue if
and only if it was won, whatever instant a node dies at. :class:`RedisAtomic` is that
path once, for every adapter; an adapter supplies two hooks:

* :meth:`RedisAtomic.build`: the firing's message, or why the firing goes two-phase;
* :meth:`RedisAtomic.commands`: the Redis commands that push a message exactly as the
  broker's own client would (and :meth:`RedisAtomic.pushed`, told the messages won).

A firing that goes two-phase (the adapter says why, or its message cannot be built) is
claimed on the same store by the core's :class:`~beatless.node.dispatch.TwoPhase`, whose
send is the framework's own: a message that cannot be built fails there in the
framework's words and its claim is released. Only an unreachable store stops the wake.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace
from typing import Generic, TypeVar

from beatless.core._logtext import ERROR_LIMIT, WarnEvery, shown
from beatless.core.durations import DurationLike
from beatless.errors import StoreError
from beatless.node.dispatch import (
    DEFAULT_LEASE,
    FAILURE_WARN_S,
    RECORDED,
    Dispatcher,
    Enqueue,
    TwoPhase,
    Wake,
    decide_claimed,
)
from beatless.schedule.firing import Firing, claim_request
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.redis.store import Ready, RedisStore, pushed_commands

logger = logging.getLogger(__name__)

M = TypeVar("M")
"""An adapter's message: what it builds for a firing and the script pushes."""

CANNOT_BUILD = (
    "firing %s of entry %s: its message cannot be built for the claim script (%s); "
    "sending it two-phase through %s"
)
"""The WARNING of a firing whose message failed to build when due: one per entry at most
every ``FAILURE_WARN_S``, the others at DEBUG."""


class RedisAtomic(Dispatcher, Generic[M]):
    """Claims firings in the broker's own Redis and pushes each won message in the same
    script; any firing that cannot take that path goes two-phase on the same store.

    ``enqueue`` is the framework's own send, for the two-phase path. Messages are built
    ahead of their release where :meth:`build` can (:meth:`prepare`); a build that fails
    ahead is silent and done again when due, where a failure is told at WARNING naming
    the entry (at most every ``FAILURE_WARN_S`` per entry; the traceback at DEBUG) and the
    firing goes two-phase.
    """

    store: RedisStore

    prepares_ahead = True
    waits_for_release = True

    sent_through = "the framework"
    """How the two-phase path sends, in the words of the log (``app.send_task``)."""

    def __init__(
        self, store: RedisStore, enqueue: Enqueue, *, lease: DurationLike = DEFAULT_LEASE
    ) -> None:
        self.store = store
        self.two_phase = TwoPhase(store, enqueue, lease=lease)
        self.lease_ms = self.two_phase.lease_ms
        self._warned = WarnEvery()
        self._scripts_loaded = False

    # -- the hooks -------------------------------------------------------------------

    @abstractmethod
    def build(self, firing: Firing, *, ahead: bool) -> M | str:
        """``firing``'s message for the claim script, or why it goes two-phase (told at
        DEBUG). ``ahead``: built a second before the release, as of the release; a message
        that depends on the instant of its send gives a reason then, and is built when due.
        Raises when the message cannot be built (a :class:`~beatless.errors.StoreError`
        when the broker's Redis cannot be reached: the wake stops there)."""

    @abstractmethod
    def commands(self, message: M) -> Sequence[Sequence[str]]:
        """The Redis commands that push ``message`` as the broker's own client would."""

    def why_two_phase(self, firing: Firing) -> str | None:
        """Why ``firing`` goes two-phase whatever its message, or ``None``."""
        return None

    def pushed(self, messages: list[M]) -> None:
        """Told the messages the script pushed (the firings won), after it ran."""

    # -- the Dispatcher seam ---------------------------------------------------------

    def prepare(self, firings: Sequence[Firing], wake: Wake) -> Sequence[object]:
        """Build each firing's message, commands and claim ahead of its release: at the
        release, what is left is the script. A firing that goes two-phase, or whose
        message cannot be built now, is built when due. The store's scripts are loaded
        on the server before the first claim (:meth:`RedisStore.load_scripts
        <beatless.stores.redis.store.RedisStore.load_scripts>`)."""
        if not self._scripts_loaded:
            with suppress(StoreError):  # else loaded by the claim itself
                self.store.load_scripts()
                self._scripts_loaded = True
        built: list[Ready[M] | None] = []
        for firing in firings:
            try:
                built.append(self._ahead(firing, wake))
            except Exception:
                built.append(None)  # built again when due, where the failure is told
        return built

    def _ahead(self, firing: Firing, wake: Wake) -> Ready[M] | None:
        if self.why_two_phase(firing) is not None:
            return None
        message = self.build(firing, ahead=True)
        return None if isinstance(message, str) else self._ready(firing, message, wake)

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        """Claim each firing and enqueue the won ones: those with a message pushed by the
        claim script (what :meth:`prepare` built, if anything), the others two-phase."""
        atomic: list[tuple[Firing, Ready[M]]] = []
        fallback: list[Firing] = []
        for firing in firings:
            built = wake.prepared(firing)
            if wake.is_late(firing):
                wake.decide(firing, DecisionOutcome.LATE)
            elif self.why_two_phase(firing) is not None:
                fallback.append(firing)
            elif isinstance(built, Ready):
                atomic.append((firing, built))
            elif (message := self._when_due(firing, wake)) is None:
                fallback.append(firing)
            else:
                atomic.append((firing, self._ready(firing, message, wake)))
        self._push(atomic, wake)
        if fallback:
            wake.until_release()
            self.two_phase.dispatch(fallback, wake)

    def _when_due(self, firing: Firing, wake: Wake) -> M | None:
        """The firing's message, built now; ``None`` when it goes two-phase."""
        try:
            message = self.build(firing, ahead=False)
        except StoreError:
            raise
        except Exception as exc:
            every_ms = int(FAILURE_WARN_S * 1_000)
            warn = self._warned.allows(firing.entry.name, every_ms, wake.now_ms())
            logger.log(
                logging.WARNING if warn else logging.DEBUG,
                CANNOT_BUILD,
                firing.id,
                shown(firing.entry.name),
                shown(exc, quoted=False, limit=ERROR_LIMIT),
                self.sent_through,
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            return None
        if isinstance(message, str):
            logger.debug("firing %s goes two-phase: %s", firing.id, shown(message, quoted=False))
            return None
        return message

    def _ready(self, firing: Firing, message: M, wake: Wake) -> Ready[M]:
        commands = pushed_commands(self.commands(message))
        request = claim_request(firing, wake.live_revision)
        return Ready(message, request, commands, wake.history_template(firing))

    def _push(self, atomic: list[tuple[Firing, Ready[M]]], wake: Wake) -> None:
        if not atomic:
            return
        notes = [r.note for _, r in atomic]
        revision = wake.live_revision  # a claim built ahead carries the revision of now
        outcomes = self.store.claim_and_push(
            [
                r.request
                if r.request.revision == revision
                else replace(r.request, revision=revision)
                for _, r in atomic
            ],
            [r.commands for _, r in atomic],
            node=wake.node,
            notes=notes if any(notes) else None,
            before_send=wake.until_release,  # packed, it waits for the release to be sent
        )
        won = []
        for (firing, ready), outcome in zip(atomic, outcomes, strict=True):
            recorded = ready.note is not None and outcome in RECORDED
            decide_claimed(wake, firing, outcome, recorded=recorded)
            if outcome.is_won:
                won.append(ready.message)
        self.pushed(won)
