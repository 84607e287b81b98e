"""The Python API of live entries: :class:`Live`, one namespace's entries in one store.

What is built: entries are stored and versioned (revisions, fences, history, revert,
plans); nodes schedule them (:mod:`beatless.node._live`).
"""

from __future__ import annotations

import builtins
import getpass
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

from beatless.core._time import from_datetime
from beatless.core.durations import DurationLike, as_timedelta, to_ms
from beatless.errors import ConfigError, ScheduleError
from beatless.live._ledger import PROPAGATION_MS, Ledger, refuse_stale
from beatless.live.codec import STORE_OWNER, entry_from_json, entry_to_json, owner_of
from beatless.live.plan import Plan, make_plan
from beatless.live.revisions import Change, Revision, diff, fold, history, state
from beatless.schedule.entry import Entry
from beatless.stores.base import ClaimStore

DEFAULT_FENCE_MS = PROPAGATION_MS
"""A revision's fence when none is asked: its commit + 2 s on the store's clock (the
least allowed: :data:`~beatless.live._ledger.PROPAGATION_MS`)."""
DEFAULT_WINDOW = "7d"
_WHERE = {
    STORE_OWNER: "through beatless.live.Live or `beatless schedule`",
    "django": "in the Django admin (its django-celery-beat row)",
}


class Live:
    """The live entries of ``namespace`` in ``store``: read, write, plan, revert.

    ``code`` names the entries the code schedule owns (names or entries): writing one of
    them is refused unless ``override=True``. ``writer`` and ``host`` default to the login
    name and the host name; ``timezone`` is the one cron entries without a zone of their
    own are planned in (the app's). Every write is one revision (see
    :mod:`beatless.live.revisions`) and returns it.
    """

    def __init__(
        self,
        store: ClaimStore,
        *,
        namespace: str = "default",
        code: Iterable[Entry | str] = (),
        writer: str | None = None,
        host: str | None = None,
        timezone: str = "UTC",
        owns_store: bool = False,
        owner: str = STORE_OWNER,
    ) -> None:
        if not store.keeps_notes:
            raise store.cannot_keep()
        if not isinstance(namespace, str) or not namespace:
            raise ConfigError(
                f"live entries: namespace must be a non-empty string, got {namespace!r}"
            )
        self.store = store
        self.namespace = namespace
        self.code = frozenset(c if isinstance(c, str) else c.name for c in code)
        self.writer = writer if writer is not None else _login()
        self.host = host if host is not None else socket.gethostname()
        self.timezone = timezone
        self.owns_store = owns_store
        self.owner = owner
        self._ledger = Ledger(store, namespace)
        self._known: dict[int, Revision] = {}
        self._current: dict[str, Any] = {}
        """The state after the revisions folded so far (:meth:`state`)."""
        self._folded = 0
        """The revisions folded into it: 1 to this."""
        self._node = f"live-writer:{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def __repr__(self) -> str:
        return f"Live({self.store!r}, namespace={self.namespace!r})"

    def close(self) -> None:
        """Close the store if this object owns it (``owns_store``)."""
        if self.owns_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------

    def head(self) -> int:
        """The current revision number (0: none yet)."""
        return self._ledger.latest()

    def revisions(self) -> builtins.list[Revision]:
        """Every revision, oldest first; those read before are not read again."""
        head = self.head()
        missing = [n for n in range(1, head + 1) if n not in self._known]
        for revision in self._ledger.read(missing):
            self._known[revision.number] = revision
        return [self._known[n] for n in range(1, head + 1) if n in self._known]

    def snapshot(self) -> tuple[int, dict[str, Any]]:
        """The current revision number and the live entries at it, as :meth:`state`."""
        revisions = self.revisions()
        return (revisions[-1].number if revisions else 0), self._now(revisions)

    def state(self, at_revision: int | None = None) -> dict[str, Any]:
        """The live entries as JSON at ``at_revision`` (``None``: now). The current state
        is kept and advanced by the revisions read since: a change costs its own size,
        not the number of entries times the number of revisions."""
        revisions = self.revisions()
        if at_revision is not None:
            return state(revisions, at_revision)
        return self._now(revisions)

    def _now(self, revisions: Sequence[Revision]) -> dict[str, Any]:
        """The state after ``revisions`` (every revision, in number order), kept between
        calls and advanced by the newer ones."""
        if revisions and revisions[-1].number != len(revisions):  # a revision unread: no cache
            return state(revisions)
        if len(revisions) < self._folded:  # the store forgot revisions
            self._current, self._folded = {}, 0
        for revision in revisions[self._folded :]:
            fold(self._current, revision.changes, in_place=True)
            self._folded = revision.number
        return dict(self._current)

    def get(self, name: str) -> Entry | None:
        found = self.state().get(name)
        return None if found is None else entry_from_json(found)

    def list(self) -> builtins.list[Entry]:
        return [entry_from_json(data) for _name, data in sorted(self.state().items())]

    def history(self, name: str | None = None) -> builtins.list[Revision]:
        """The revisions that changed ``name`` (every revision for ``None``), oldest first."""
        return history(self.revisions(), name)

    # -- writing -------------------------------------------------------------------------

    def put(self, entry: Entry, **how: Any) -> Revision:
        """Put one entry as a new revision: ``if_revision``, ``note``, ``override``,
        ``effective_in``, ``at`` as for :meth:`put_many`."""
        return self.put_many([entry], **how)

    def put_many(
        self,
        entries: Sequence[Entry],
        *,
        if_revision: int | None = None,
        note: str | None = None,
        override: bool = False,
        effective_in: DurationLike | None = None,
        at: datetime | int | None = None,
    ) -> Revision:
        """Put ``entries`` as one revision. ``if_revision``: refuse
        (:class:`~beatless.errors.StaleRevision`) unless it is the current revision.
        ``override``: allowed to write a name the code schedule owns. The fence is the
        commit + 2 s, or + ``effective_in``, or ``at`` (an instant not in the past)."""
        return self.change(
            put=entries,
            if_revision=if_revision,
            note=note,
            override=override,
            effective_in=effective_in,
            at=at,
        )

    def delete(self, name: str, **how: Any) -> Revision:
        """Delete one entry as a new revision (no firing of it at or after the fence)."""
        return self.delete_many([name], **how)

    def delete_many(
        self,
        names: Sequence[str],
        *,
        if_revision: int | None = None,
        note: str | None = None,
        effective_in: DurationLike | None = None,
        at: datetime | int | None = None,
    ) -> Revision:
        return self.change(
            delete=names, if_revision=if_revision, note=note, effective_in=effective_in, at=at
        )

    def change(
        self,
        put: Sequence[Entry] = (),
        delete: Sequence[str] = (),
        *,
        sources: Mapping[str, Any] | None = None,
        if_revision: int | None = None,
        note: str | None = None,
        override: bool = False,
        effective_in: DurationLike | None = None,
        at: datetime | int | None = None,
    ) -> Revision:
        """Put ``put`` and delete ``delete`` as one revision, as :meth:`put_many` and
        :meth:`delete_many` do. ``sources`` gives, by name, what a bridge keeps with an
        entry it writes (stored as the entry's ``"source"``)."""
        self._check_names([e.name for e in put], override)
        head, live = self.snapshot() if put or delete else (0, {})
        if put or delete:  # a change based on an older revision is stale, not wrong
            refuse_stale(self.namespace, if_revision, head)
        unknown = [n for n in delete if n not in live]
        if unknown:
            raise ConfigError(f"live entries of {self.namespace!r}: no live entry {unknown[0]!r}")
        self._check_owners([*(e.name for e in put), *delete], live)
        changes = [
            Change(e.name, self._stored(e, (sources or {}).get(e.name)), e.name in self.code)
            for e in put
        ]
        changes += [Change(name, None) for name in delete]
        return self._commit(changes, if_revision, note, effective_in, at)

    def _check_owners(self, names: Iterable[str], live: Mapping[str, Any]) -> None:
        """Refuse ``names`` that another owner wrote in the live entries ``live``."""
        foreign = [n for n in names if n in live and owner_of(live[n]) != self.owner]
        if foreign:
            owner = owner_of(live[foreign[0]])
            raise ScheduleError(
                f"live entry {foreign[0]!r} is owned by {owner!r}, not {self.owner!r} (a name "
                f"lives in one source): change it {_WHERE.get(owner, 'where it is owned')}"
            )

    def _own(self, live: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of ``live`` this writer's owner wrote: the only ones its plans and
        reverts change."""
        return {name: data for name, data in live.items() if owner_of(data) == self.owner}

    def _stored(self, entry: Entry, source: Any) -> dict[str, Any]:
        data = entry_to_json(entry)
        if self.owner != STORE_OWNER:
            data["owner"] = self.owner
        if source is not None:
            data["source"] = source
        return data

    def revert(
        self,
        to: int,
        *,
        note: str | None = None,
        if_revision: int | None = None,
        effective_in: DurationLike | None = None,
        at: datetime | int | None = None,
    ) -> Revision:
        """A new revision whose state equals the state at revision ``to`` (0: no live
        entry) for this writer's owner's entries (another owner's stay as they are),
        refused if another revision comes first (based on the head it read)."""
        revisions = self.revisions()
        head = revisions[-1].number if revisions else 0
        if not 0 <= to <= head:
            raise ConfigError(
                f"live entries of {self.namespace!r}: no revision {to} (current: {head})"
            )
        changes = diff(self._own(state(revisions)), self._own(state(revisions, to)))
        base = head if if_revision is None else if_revision
        return self._commit(changes, base, note or f"revert to {to}", effective_in, at)

    # -- plans ---------------------------------------------------------------------------

    def plan(
        self,
        entries: Sequence[Entry],
        window: DurationLike = DEFAULT_WINDOW,
        *,
        start_ms: int | None = None,
        effective_in: DurationLike | None = None,
        override: bool = False,
        merge: bool = False,
    ) -> Plan:
        """What making the live entries equal to ``entries`` would do over ``window``
        from the fence (see :mod:`beatless.live.plan`); writes nothing. Only this
        writer's owner's entries are compared and changed: those of another owner (the
        django-celery-beat bridge's) stay, and a name of theirs in ``entries`` is
        refused. ``merge=True``: this owner's live entries ``entries`` does not name stay
        as they are too (a plan that only adds and changes, as an import makes).
        ``start_ms`` (default: the store's clock) makes it reproducible."""
        self._check_names([e.name for e in entries], override)
        head = self.head()
        live = state(self.revisions(), head)
        self._check_owners([e.name for e in entries], live)
        current = self._own(live)
        target = dict(current) if merge else {}
        target.update({e.name: entry_to_json(e) for e in entries})
        start = self.store.time_ms() if start_ms is None else start_ms
        fence = start + _delay_ms(effective_in)
        end = fence + to_ms(as_timedelta(window, name="window"))
        return make_plan(
            self.namespace,
            head,
            current,
            target,
            start_ms=start,
            fence_ms=fence,
            end_ms=end,
            timezone=self.timezone,
        )

    def apply(self, plan: Plan, *, note: str | None = None) -> Revision | None:
        """Write a plan's changes as one revision, refused if another revision came after
        the one it was made against; ``None`` for a plan with no change. Its fence is the
        commit + the plan's delay, or + the propagation bound if that is longer."""
        if plan.namespace != self.namespace:
            raise ConfigError(
                f"a plan of namespace {plan.namespace!r} applied to {self.namespace!r}"
            )
        if plan.is_empty:
            return None
        changes = [Change(c.name, c.entry, c.name in self.code) for c in plan.changes]
        delay = max(plan.fence_ms - plan.start_ms, PROPAGATION_MS)  # never under the bound
        return self._commit(changes, plan.base_revision, note, timedelta(milliseconds=delay), None)

    # -- inside ----------------------------------------------------------------------------

    def _check_names(self, names: Iterable[str], override: bool) -> None:
        owned = sorted(set(names) & self.code)
        if owned and not override:
            raise ScheduleError(
                f"entry {owned[0]!r} is owned by the code schedule (a name lives in one "
                f"source): change it in the code, or write it live with override=True, "
                f"reported as drift until the code catches up"
            )

    def _commit(
        self,
        changes: Sequence[Change],
        if_revision: int | None,
        note: str | None,
        effective_in: DurationLike | None,
        at: datetime | int | None,
    ) -> Revision:
        if not changes:
            raise ConfigError(f"live entries of {self.namespace!r}: nothing to change")
        fence = self._fence(effective_in, at)
        return self._ledger.commit(
            changes,
            writer=self.writer,
            host=self.host,
            note=note or "",
            fence=fence,
            if_revision=if_revision,
            node=self._node,
        )

    def _fence(
        self, effective_in: DurationLike | None, at: datetime | int | None
    ) -> Callable[[int], int]:
        if at is not None and effective_in is not None:
            raise ConfigError("live entries: give effective_in or at, not both")
        if at is None:
            delay = _delay_ms(effective_in)
            if delay < PROPAGATION_MS:
                raise ConfigError(
                    f"live entries: effective_in {delay} ms is under the propagation bound "
                    f"({PROPAGATION_MS} ms): every node must be able to read a change before "
                    f"its fence; use effective_in of at least {PROPAGATION_MS // 1_000}s"
                )
            return lambda committed_ms: committed_ms + delay
        at_ms = from_datetime(at) if isinstance(at, datetime) else int(at)
        now = self.store.time_ms()
        if at_ms < now:
            raise ConfigError(
                f"live entries: at {at_ms} is {now - at_ms} ms in the past on the store's "
                f"clock; a change is never retroactive"
            )
        if at_ms < now + PROPAGATION_MS:
            raise ConfigError(
                f"live entries: at {at_ms} is {at_ms - now} ms from now on the store's "
                f"clock, under the propagation bound ({PROPAGATION_MS} ms); choose a later "
                f"instant"
            )
        return lambda committed_ms: max(at_ms, committed_ms + PROPAGATION_MS)


def _delay_ms(effective_in: DurationLike | None) -> int:
    if effective_in is None:
        return DEFAULT_FENCE_MS
    delay = to_ms(as_timedelta(effective_in, name="effective_in"))
    if delay < 0:
        raise ConfigError(f"live entries: effective_in must not be negative, got {delay} ms")
    return delay


def _login() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in a container without a passwd entry
        return "unknown"
