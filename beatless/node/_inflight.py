"""What a node knows of each firing between its release and its decision, kept in one place.

A firing can be handed to the dispatcher in this wake (*open*), handed to the broker and
not decided yet (*sent*), refused by a full or refusing store (*unjudged*), seen held by
another node's pending claim (*held*), left to a node ranked above this one (*ranked*:
where this node ranks for it), or be the catch-up firing that coalesced earlier
occurrences (*coalesced*). Once late, an unjudged or held firing is not decided ``late``:
the store is asked who holds it first (:mod:`beatless.node._judging`). So is any firing
released before this node's last claim the store refused (:meth:`InFlight.unjudged`): a
node held up by refused calls reaches the firings released meanwhile only once they are
late, and another node, refused too or too slow to send its claim while it was young,
may not have sent them either.

A firing of this wake, open or sent, is one entry of the wake's maps; the rest lives in
one :class:`Flight` per firing, made when one of these is first so (or when the firing
is tried again), since most firings are decided in the wake that opened them. There is
one clean-up rule: all of a firing goes at its decision (:meth:`InFlight.finish`); a
firing decided ``held`` starts a new record, since this node looks at it again
(:meth:`InFlight.hold`).
"""

from __future__ import annotations

from dataclasses import dataclass

from beatless.node._prefer import Ranked
from beatless.schedule.firing import Firing


@dataclass(slots=True)
class Flight:
    """One firing between its release and its decision."""

    firing: Firing
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
        self._open: dict[str, Firing] = {}
        """The firings handed to the dispatcher in this wake and neither decided, tried
        again nor sent, in the wake's order."""
        self._sent: dict[str, tuple[Firing, str]] = {}
        """The firings sent and not decided, in the order of their sends, each with the
        outcome it is decided as if the dispatcher leaves it undecided (``won`` or
        ``takeover``)."""
        self._refused_ms: int | None = None
        """When the store last refused a claim of this node (full or refusing), node clock."""

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
        self._open = {firing.id: firing for firing in firings}

    def left_open(self) -> list[Firing]:
        """The firings of this wake still open: neither decided, retried nor sent."""
        return list(self._open.values())

    def left_sent(self) -> list[tuple[Firing, str]]:
        """The firings sent and not decided, each with its outcome."""
        return list(self._sent.values())

    def unjudged(self, now_ms: int) -> None:
        """The store refused, at ``now_ms``, the claims of the open firings (full, or its
        settings): they, and every firing released before, are left to its judgment if
        they go late."""
        self._refused_ms = now_ms
        for firing in self._open.values():
            self._of(firing).unjudged = True

    def refused_after(self, instant_ms: int) -> bool:
        """Whether the store refused a claim of this node at or after ``instant_ms``."""
        return self._refused_ms is not None and instant_ms <= self._refused_ms

    def judging(self, firing: Firing) -> bool:
        """Whether ``firing``, gone late, is unjudged, was released before a claim the
        store refused, or was seen held by another node, and so left to the store's
        judgment rather than decided ``late`` (another node may have sent it, or given it
        up unsent): it then leaves the wake, keeping its record until its decision."""
        flight = self._flights.get(firing.id)
        refused = self.refused_after(firing.release_ms)
        if not refused and (flight is None or not (flight.unjudged or flight.held)):
            return False
        self._open.pop(firing.id, None)
        self._sent.pop(firing.id, None)
        return True

    def sent(self, firing: Firing, outcome: str) -> None:
        """``firing`` was handed to the broker: from now on it is never retried."""
        self._open.pop(firing.id, None)
        self._sent[firing.id] = (firing, outcome)

    def retried(self, firing: Firing) -> bool:
        """``firing`` leaves this wake to be tried again, keeping a record until its
        decision; ``False`` if it was sent, and so is not."""
        id_ = firing.id
        if id_ in self._sent:
            return False
        self._open.pop(id_, None)
        if id_ not in self._flights:
            self._flights[id_] = Flight(firing)
        return True

    def finish(self, firing: Firing) -> tuple[Flight | None, str]:
        """``firing`` is decided: all of it goes (the one clean-up); its record is
        returned, with the outcome it was sent as (empty: not sent)."""
        id_ = firing.id
        self._open.pop(id_, None)
        sent = self._sent.pop(id_, None)
        return self._flights.pop(id_, None), "" if sent is None else sent[1]

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
        """How many firings are between their release and their decision."""
        return len(self._flights.keys() | self._open.keys() | self._sent.keys())
