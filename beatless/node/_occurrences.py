"""A trigger's occurrences as the timeline walks them: the entries that share one trigger
(:class:`Group`), and an iterator over its occurrences that holds little between two
(:class:`Occurrences`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from beatless.core.triggers import Trigger
from beatless.schedule.entry import Entry


@dataclass(slots=True)
class Group:
    """The entries that share one trigger, and where that trigger has got to."""

    trigger: Trigger
    entries: list[Entry]
    occurrences: Iterator[int]
    live: bool = False
    """One live definition (:mod:`beatless.node._live`): over once a later revision
    takes its place."""

    @property
    def reach_ms(self) -> int:
        """How far back an occurrence of this trigger may still be claimable."""
        return max(entry.max_late_ms for entry in self.entries)

    @property
    def memory_ms(self) -> int:
        """How long after an occurrence of this trigger the store may remember a claim."""
        return max(entry.memory_ms for entry in self.entries)


KEEP_GENERATOR_MS = 60_000
"""A trigger whose occurrences come closer than this keeps its generator between two."""


class Occurrences:
    """A trigger's occurrences after ``after_ms``, as an iterator that holds the last one
    it gave rather than a generator (a cron's holds a kilobyte of frames, and a node
    holds one per distinct trigger): the next is asked of the trigger again, after the
    last (occurrences are a pure function of the trigger and the instant, rule 1). A
    trigger whose occurrences come often keeps its generator, which is quicker."""

    __slots__ = ("_ahead", "last", "trigger")

    def __init__(self, trigger: Trigger, after_ms: int) -> None:
        self.trigger = trigger
        self.last = after_ms
        self._ahead: Iterator[int] | None = None

    def __iter__(self) -> Occurrences:
        return self

    def __next__(self) -> int:
        ahead = self._ahead if self._ahead is not None else iter(self.trigger.after(self.last))
        occurrence = next(ahead)
        self._ahead = ahead if occurrence - self.last < KEEP_GENERATOR_MS else None
        self.last = occurrence
        return occurrence
