"""What a node knows of each firing between its release and its decision: one record.

A firing can be handed to the dispatcher in this wake (*open*), handed to the broker and
not decided yet (*sent*), refused by a full or refusing store (*unjudged*), seen held by
another node's pending claim (*held*), left to a node ranked above this one (*ranked*:
where this node ranks for it), or be the catch-up firing that coalesced earlier
occurrences (*coalesced*). Once late, an unjudged or held firing is not decided ``late``:
the store is asked who holds it first (:mod:`beatless.node._judging`).

All of it lives in one :class:`Flight` per firing, kept only while one of these is so,
and there is one clean-up rule: the record goes at the firing's decision
(:meth:`InFlight.finish`); a firing decided ``held`` starts a new one, since this node
looks at it again (:meth:`InFlight.hold`).
"""

from __future__ import annotations

from dataclasses import dataclass

from beatless.node._prefer import Ranked
from beatless.schedule.firing import Firing

IDLE, OPEN, SENT = 0, 1, 2
"""Where a firing stands in the wake: not in it, handed to the dispatcher, sent."""


@dataclass(slots=True)
class Flight:
    """One firing between its release and its decision."""

    firing: Firing
    step: int = IDLE
    sent_as: str = ""
    """``won`` or ``takeover``: the outcome of a sent firing, decided so if the
    dispatcher leaves it undecided."""
    unjudged: bool = False
    reseeding: bool = False
    """Held off by the store while the nodes re-seed it (:mod:`._reseed`): ``forgotten``
    rather than ``late`` if still so when late."""
    held: bool = False
    ranked: Ranked | None = None
    coalesced: tuple[int, int] | None = None
    """The first and last occurrence the ``latest`` catch-up coalesced into it."""


class InFlight:
    """The :class:`Flight` of each firing that has one, and the firings of this wake."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}
        self._wake: list[Flight] = []
        """The firings handed to the dispatcher in this wake, in its order."""
        self._sent: list[Flight] = []
        """The firings sent in this wake, in the order of their sends."""

    def _of(self, firing: Firing) -> Flight:
        flight = self._flights.get(firing.id)
        if flight is None:
            flight = self._flights[firing.id] = Flight(firing)
        return flight

    def get(self, firing: Firing) -> Flight | None:
        """The record of ``firing``, if it has one (read only)."""
        return self._flights.get(firing.id)

    def open(self, firings: list[Firing]) -> None:
        """A wake hands ``firings`` to the dispatcher: each is open until it is decided,
        retried or sent."""
        flights = self._flights
        opened: list[Flight] = []
        self._wake, self._sent = opened, []
        for firing in firings:  # as _of, on every firing's path
            flight = flights.get(firing.id)
            if flight is None:
                flight = flights[firing.id] = Flight(firing, OPEN)
            else:
                flight.step = OPEN
            opened.append(flight)

    def left_open(self) -> list[Firing]:
        """The firings of this wake still open: neither decided, retried nor sent."""
        return [flight.firing for flight in self._wake if flight.step == OPEN]

    def left_sent(self) -> list[tuple[Firing, str]]:
        """The firings of this wake sent and not decided, each with its outcome."""
        return [(flight.firing, flight.sent_as) for flight in self._sent if flight.step == SENT]

    def unjudged(self) -> None:
        """The store refused the claims of the open firings (full, or its settings)."""
        for flight in self._wake:
            if flight.step == OPEN:
                flight.unjudged = True

    def judging(self, firing: Firing) -> bool:
        """Whether ``firing``, gone late, is unjudged or was seen held by another node, and
        so left to the store's judgment rather than decided ``late`` (the holder may have
        given it up unsent): it then leaves the wake, keeping its record until its
        decision."""
        flight = self._flights.get(firing.id)
        if flight is None or not (flight.unjudged or flight.held):
            return False
        flight.step = IDLE
        return True

    def sent(self, firing: Firing, outcome: str) -> None:
        """``firing`` was handed to the broker: from now on it is never retried."""
        flight = self._flights.get(firing.id)
        if flight is None:
            flight = self._flights[firing.id] = Flight(firing)
        if flight.step != SENT:
            self._sent.append(flight)
        flight.step, flight.sent_as = SENT, outcome

    def retried(self, firing: Firing) -> bool:
        """``firing`` leaves this wake to be tried again; ``False`` if it was sent, and so
        is not."""
        flight = self._flights.get(firing.id)
        if flight is None:
            return True
        if flight.step == SENT:
            return False
        flight.step = IDLE
        return True

    def finish(self, firing: Firing) -> Flight | None:
        """``firing`` is decided: its record goes (the one clean-up), and is returned."""
        flight = self._flights.pop(firing.id, None)
        if flight is not None:
            flight.step = IDLE
        return flight

    def hold(self, firing: Firing, coalesced: tuple[int, int] | None) -> None:
        """``firing``, decided ``held``, is looked at again: seen held, keeping what it
        coalesced."""
        flight = self._of(firing)
        flight.held, flight.coalesced = True, coalesced

    def held_off(self, firing: Firing) -> None:
        """The store held ``firing`` off while the nodes re-seed it."""
        self._of(firing).reseeding = True

    def forget_held(self) -> None:
        """The store was re-seeded: no firing seen held before counts as seen held (a
        node that sent one wrote it back)."""
        for flight in self._flights.values():
            flight.held = False

    def was_held(self, firing: Firing) -> bool:
        flight = self._flights.get(firing.id)
        return flight is not None and flight.held

    def coalesced(self, firing: Firing) -> tuple[int, int] | None:
        flight = self._flights.get(firing.id)
        return None if flight is None else flight.coalesced

    def coalesce(self, firing: Firing, first: int, last: int) -> None:
        """``firing`` is the catch-up firing of the occurrences ``first`` to ``last``."""
        self._of(firing).coalesced = (first, last)

    def take_ranked(self, firing: Firing) -> Ranked | None:
        """Where this node ranked for ``firing`` when it left it to others, once."""
        flight = self._flights.get(firing.id)
        if flight is None:
            return None
        ranked, flight.ranked = flight.ranked, None
        return ranked

    def rank(self, firing: Firing, ranked: Ranked) -> None:
        """Keep where this node ranks for ``firing``, left to others, for its next look."""
        self._of(firing).ranked = ranked

    def __len__(self) -> int:
        return len(self._flights)
