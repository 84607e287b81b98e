"""What the readers of a node see of it: small read-only views, not the loop's fields.

The board thread reads its node through :class:`LoopView`; metrics, the Celery
``inspect`` command, ``celery beat`` and the Dramatiq scheduler process read a running
node through :class:`NodeView`. :class:`beatless.node.scheduler.Scheduler` is both; a
reader that types against a view depends on what it reads, not on the loop's class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from beatless.fleet._notes import NodeRecord
from beatless.node._clockwatch import ClockWatch
from beatless.node._live import LiveView
from beatless.node._prefer import Preference
from beatless.node.stats import EntryStats, SkippedNotes
from beatless.schedule.entry import Schedule
from beatless.stores.base import ClaimStore


class LoopView(Protocol):
    """What the board reads of its node's loop."""

    @property
    def node(self) -> str: ...

    @property
    def store(self) -> ClaimStore: ...

    @property
    def schedule(self) -> Schedule: ...

    @property
    def stats(self) -> Mapping[str, EntryStats]:
        """What the node decided for each entry since it started, by entry name."""
        ...

    @property
    def clockwatch(self) -> ClockWatch: ...

    @property
    def preference(self) -> Preference: ...

    @property
    def live(self) -> LiveView:
        """The live revisions the node knows (:mod:`beatless.node._live`)."""
        ...

    def now_ms(self) -> int:
        """The node's clock, in epoch milliseconds."""
        ...


class BoardView(Protocol):
    """What a reader reads of a node's board: the fleet as the node last read it, its
    last wake, the notes it skipped, and its registry record."""

    @property
    def registry(self) -> Sequence[NodeRecord]: ...

    @property
    def last_wake_ms(self) -> int | None: ...

    @property
    def skipped(self) -> SkippedNotes: ...

    def node_record(self, now_ms: int) -> NodeRecord:
        """The node's registry record, as it would be posted at ``now_ms``."""
        ...

    def leave_out(self, names: Sequence[str]) -> None:
        """Told which entries of the schedule the node leaves out, each for a problem."""
        ...

    def restarted(self, count: int, last: str | None, last_ms: int | None) -> None:
        """Told by a supervisor that started the node's process again: how often, and
        why and when it last died; shown in the registry record."""
        ...


class NodeView(Protocol):
    """What a reader reads of a running node."""

    @property
    def node(self) -> str: ...

    @property
    def schedule(self) -> Schedule: ...

    @property
    def stats(self) -> Mapping[str, EntryStats]: ...

    @property
    def clockwatch(self) -> ClockWatch: ...

    @property
    def live(self) -> LiveView: ...

    @property
    def board(self) -> BoardView: ...

    def now_ms(self) -> int: ...

    def loop_alive(self) -> bool:
        """Whether the node's loop runs."""
        ...
