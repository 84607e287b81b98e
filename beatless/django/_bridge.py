"""Change detection and publishing: django-celery-beat's rows as live entries owned by
``django``.

One :meth:`Bridge.poll` (the node that won this second's poll runs it,
:mod:`beatless.django._duty`):

1. reads the markers of the table (:class:`~beatless.django._orm.Probe`):
   ``PeriodicTasks.last_update``, ``max(date_changed)``, the row count, the highest
   row id. Unchanged since this node's last poll, not a full pass and nothing owed
   (step 5): nothing else is read.
2. reads the rows whose ``date_changed`` is after the last ``max(date_changed)``
   this node saw (every row on its first poll, and on a full pass), and again the rows
   that a full read which lost (step 5) found different;
3. compares each row's digest (:meth:`~beatless.django._mapping.Row.digest`) with the
   one stored beside its live entry (``"source": {"id", "row"}``): only a row whose
   definition changed is mapped again and published; a row renamed deletes its old name;
4. reads every row when the partial read cannot explain the markers: a row count lower
   than expected (a delete: expected is the count then plus the changed rows created
   since, whose ids are above the highest then, whether or not another node already
   published them), or ``last_update`` moved with no changed row found (a schedule row
   edited, a delete, a writer whose clock is behind the last one's). A changed row
   explains it whether this poll publishes it or another node's poll already did: in a
   fleet, the node that polls next often finds only rows the previous one published. (A
   schedule row edited in the same gap as a task row is then found by the next node
   whose last poll came after that task row's save, or by the full pass.) A full pass
   (every ``hash_every`` seconds, :mod:`~beatless.django._duty`) also deletes the
   entries of rows that are gone and catches what no marker shows: ``queryset.update()``
   and raw SQL;
5. writes every put and delete of the poll as one revision, based on the head it read
   *before* reading the rows (``if_revision``): two pollers never publish over each
   other's head, and a poll that read the rows before another node's revision (it was
   slow, or its node was frozen between its read and its write) never publishes them
   over that newer one. The loser publishes at a later poll what is still different: a
   partial poll that lost reads the same changed rows again; a full read that lost
   remembers the rows it found different (and the entries whose row it found gone), and
   this node's next poll is partial from that read's markers, with those rows read
   again against the head of then. Every row state published is read after the head it
   is written on: a row is never set back, and a full read that loses is not repeated
   (at 10,000 rows a full read under load outlasts the gap between two edits, and would
   lose again and again).

A row the bridge cannot run (a solar schedule without ``ephem`` installed, arguments
that are not JSON, a name that the code schedule or a hand-written live entry already
owns) is logged at WARNING once per definition, and its entry, if it had one, is
deleted: it does not run under a definition the admin no longer shows.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from beatless.celery._settings import CelerySettings
from beatless.core._logtext import shown
from beatless.django._mapping import Row, RowRefused, entry_of_row
from beatless.django._orm import Probe
from beatless.errors import StaleRevision
from beatless.live.api import Live
from beatless.live.codec import owner_of
from beatless.live.revisions import Revision
from beatless.schedule.entry import Entry

logger = logging.getLogger(__name__)

OWNER = "django"
"""The owner of the live entries the bridge writes."""
ONE_OFF_LEAD_MS = 3_000
"""A one-off row's occurrence is its first at or after the store's clock + this: past the
fence of the revision that publishes it (commit + 2 s) with a second to spare."""


class RowSource(Protocol):
    """What the bridge reads of the rows (:class:`~beatless.django._orm.DjangoRows`)."""

    def probe(self) -> Probe: ...

    def changed_since(self, instant: Any) -> list[Row]: ...

    def by_ids(self, ids: Collection[Any]) -> list[Row]: ...

    def all(self) -> list[Row]: ...


@dataclass
class PollResult:
    """What one poll did: the rows it read, whether it read them all, the revision it
    wrote (``None``: nothing had changed)."""

    read: int = 0
    complete: bool = False
    revision: Revision | None = None
    refused: list[str] = field(default_factory=list)
    stale: bool = False
    """Another poller's revision came first: nothing written; the next poll compares the
    rows again with it."""


class _View(NamedTuple):
    """The live entries a poll compares its rows with."""

    head: int
    current: dict[str, Any]
    mine: dict[str, Any]
    """The entries owned by ``django``."""
    by_id: dict[Any, str]
    """Their names, by row id."""


class Bridge:
    """Publishes django-celery-beat's rows into ``live`` (a :class:`~beatless.live.Live`
    whose owner is ``django``), mapped with the app's ``settings``."""

    def __init__(
        self, live: Live, rows: RowSource, settings: CelerySettings, *, tz_aware: bool = True
    ) -> None:
        if live.owner != OWNER:
            raise ValueError(f"the bridge writes as owner {OWNER!r}, not {live.owner!r}")
        self.live = live
        self.rows = rows
        self.settings = settings
        self.tz_aware = tz_aware
        self._probe: Probe | None = None
        self._warned: dict[str, str] = {}
        """Refused rows already logged: name -> digest."""
        self._owed: set[Any] = set()
        """Row ids a full read that lost found different (rows to publish, or gone): the
        next poll reads them again."""

    def poll(self, *, full: bool = False) -> PollResult | None:
        """One poll (see the module docstring); ``full`` reads every row. ``None`` when
        the markers had not moved since this node's last poll and nothing was owed."""
        probe = self.rows.probe()
        seen = self._probe
        if not full and not self._owed and seen is not None and probe == seen:
            return None
        if full or seen is None or seen.max_changed is None:
            return self._publish_all(probe)
        view = self._view()
        changed = self.rows.changed_since(seen.max_changed)
        # Rows created since: their ids are above the highest then (not "without an entry":
        # another node may have published them already, and a delete would go unseen).
        new = sum(1 for row in changed if seen.max_id is None or row.id > seen.max_id)
        rows, missing = changed, set()
        if self._owed:
            again = self._owed - {row.id for row in changed}
            found = self.rows.by_ids(sorted(again)) if again else []
            rows = changed + found
            missing = again - {row.id for row in found}
        result, _ = self._publish(rows, complete=False, view=view, missing=missing)
        if result.stale:  # the same rows (and what is owed) are read again next poll
            return result
        gone = probe.count < seen.count + new
        unexplained = not changed and probe.last_update != seen.last_update
        if gone or unexplained:
            return self._publish_all(probe)
        self._probe = probe
        self._owed = set()
        return result

    def _publish_all(self, probe: Probe) -> PollResult:
        """A full read; ``probe``: the markers read before it. Lost to a newer revision,
        the next poll is partial from these markers, with what it found different read
        again (not another full read, which would lose again while edits go on)."""
        view = self._view()
        result, wanted = self._publish(self.rows.all(), complete=True, view=view)
        self._owed = self._owed | wanted if result.stale else set()
        self._probe = probe
        return result

    def _view(self) -> _View:
        head, current = self.live.snapshot()
        mine = {name: data for name, data in current.items() if owner_of(data) == OWNER}
        by_id = {source_of(data)[0]: name for name, data in mine.items()}
        return _View(head, current, mine, by_id)

    def _publish(
        self, rows: list[Row], *, complete: bool, view: _View, missing: Collection[Any] = ()
    ) -> tuple[PollResult, set[Any]]:
        """Publish what differs between ``rows`` and ``view``, the live entries read
        *before* the rows: a revision another node wrote after that read (from rows it
        read later, perhaps) makes this one stale, so that rows read before a newer
        revision never replace it, however long this poll took. ``missing``: row ids
        looked for and not found, whose entries are deleted. Also returns the ids of the
        rows (and of the deleted entries' rows) that differed."""
        head, current, mine, by_id = view
        fence_ms = self.live.store.time_ms() + ONE_OFF_LEAD_MS
        result = PollResult(read=len(rows), complete=complete)
        puts: list[Entry] = []
        sources: dict[str, Any] = {}
        deletes: set[str] = set()
        wanted: set[Any] = set()
        for row in rows:
            renamed = by_id.get(row.id)
            if renamed is not None and renamed != row.name:
                deletes.add(renamed)
                wanted.add(row.id)
            source: dict[str, Any] = {"id": row.id, "row": row.digest()}
            known = mine.get(row.name)
            if known is not None and known.get("source") == source:
                continue
            try:
                puts.append(self._entry(row, current, fence_ms))
                sources[row.name] = source
                wanted.add(row.id)
            except RowRefused as exc:
                self._refuse(row, source["row"], str(exc))
                result.refused.append(row.name)
                if known is not None:
                    deletes.add(row.name)
                    wanted.add(row.id)
        names = {row.name for row in rows}
        if complete:
            gone = {name for name in mine if name not in names}
        else:
            gone = {by_id[i] for i in missing if i in by_id and by_id[i] not in names}
        deletes |= gone
        wanted |= {source_of(mine[name])[0] for name in gone} - {None}
        deletes -= set(sources)
        if puts or deletes:
            try:
                result.revision = self.live.change(
                    puts,
                    sorted(deletes),
                    sources=sources,
                    if_revision=head,
                    note=_note(puts, deletes),
                )
            except StaleRevision:  # another node's poll published first: compare again
                result.stale = True
        return result, wanted

    def _entry(self, row: Row, current: Mapping[str, Any], fence_ms: int) -> Entry:
        label = f"django-celery-beat row {row.name!r} (id {row.id})"
        if row.name in self.live.code:
            raise RowRefused(
                f"{label}: the name is an entry of the code schedule (beat_schedule); a name "
                f"lives in one source: rename the row or remove the code entry"
            )
        if row.name in current and owner_of(current[row.name]) != OWNER:
            raise RowRefused(
                f"{label}: the name is a live entry written by {owner_of(current[row.name])!r} "
                f"(a name lives in one source): rename the row or delete that live entry"
            )
        return entry_of_row(row, self.settings, fence_ms=fence_ms, tz_aware=self.tz_aware)

    def _refuse(self, row: Row, digest: str, reason: str) -> None:
        if self._warned.get(row.name) == digest:
            return
        self._warned[row.name] = digest
        logger.warning("beatless: %s; not scheduled", shown(reason, quoted=False))


def source_of(data: Any) -> tuple[Any, Any]:
    """The row id and digest a bridge entry carries (``None``s for a foreign one)."""
    source = data.get("source") if isinstance(data, dict) else None
    if not isinstance(source, dict):
        return None, None
    return source.get("id"), source.get("row")


def _note(puts: list[Entry], deletes: set[str]) -> str:
    parts = []
    if puts:
        parts.append("put " + ", ".join(sorted(e.name for e in puts)[:5]))
    if deletes:
        parts.append("delete " + ", ".join(sorted(deletes)[:5]))
    more = len(puts) + len(deletes) - sum(min(5, n) for n in (len(puts), len(deletes)))
    return "django-celery-beat rows: " + "; ".join(parts) + (f" (+{more} more)" if more else "")


__all__ = ["OWNER", "Bridge", "PollResult", "RowSource", "source_of"]
