"""The node's timeline: when each firing of its schedule is due, in one heap.

* Occurrences are computed once per distinct trigger within its window
  (:attr:`Entry.windowed <beatless.schedule.entry.Entry.windowed>`, a :class:`Group`)
  and shared by every entry and tenant that uses it; each is expanded into firings
  ``EXPAND_AHEAD_MS`` (more for a big fan-out) before it is due. A disabled entry is in
  no group: it schedules nothing.
* At start, the occurrences still within ``max_late`` are caught up as each entry's
  ``catch_up`` policy says (``latest``, ``all``, ``none``).
* After a clock jump or a long freeze, the occurrences late for every entry of a trigger
  are skipped in one step, and a firing due more than ``max_late`` after its occurrence
  is handed back as late, before any store call: an overloaded node drops old work first.
* Fan-outs release their tenants' firings over the window, a chunk at a time; firings
  left to a node ranked above this one wait here for their next look.
* A wake hands out its due firings first: occurrences it reached to expand ahead of time
  are expanded after the wake's dispatch (:meth:`Timeline.expand_reached`), so that the
  firings released at that instant do not wait for them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from beatless.core._logtext import shown
from beatless.core.triggers import Trigger
from beatless.fleet._controls import Control, manual_firing
from beatless.node._inflight import InFlight
from beatless.node._live import WAIT_MS, LiveView
from beatless.node._occurrences import Group, Occurrences
from beatless.node._prefer import Preference
from beatless.node._tally import Tally
from beatless.schedule._fanout import MAX_TENANTS, FanOut, prepare_ahead_ms
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.firing import Firing, iso

logger = logging.getLogger("beatless.node.scheduler")

EXPAND_AHEAD_MS = 1_250
"""Occurrences are expanded into firings this long before they are due: a quarter of a
second off the whole seconds most releases fall on, so that the nodes expanding do not
wake when the preferred one sends. A read of the live head at the expansion confirms the
occurrence (:data:`beatless.node._live.CONFIRM_MS` is longer)."""
FAN_OUT_STEP_MS = 20
"""A fan-out hands out its firings at most this often: a million tenants over ten minutes
release 1,667 firings a second, and one wake (one claim, one commit) per release would
make each round trip carry two or three of them."""
MAX_BATCH = 5_000
"""At most this many firings go to the dispatcher in one wake; the rest follow at once."""
TENANTS_WARN_EVERY_MS = 60_000
"""One ERROR per entry at most this often while its tenants callable fails."""


@dataclass(frozen=True, slots=True)
class Deferred:
    """A due firing this node left to a node ranked above it, to look at again."""

    firing: Firing


def _known(tenants: object) -> tuple[str, ...]:
    return tenants if isinstance(tenants, tuple) else ()


Decide = Callable[[Firing, str], None]
"""How the timeline hands back a due firing it decided itself (``late``, ``delegated``)."""


class Timeline:
    """The heap of what is due when: occurrences to expand, firings at their release,
    fan-outs, and firings left to others. ``start_ms`` is when the node started (what
    came before is caught up), ``now_ms`` its clock."""

    def __init__(
        self,
        schedule: Schedule,
        *,
        start_ms: int,
        now_ms: Callable[[], int],
        tally: Tally,
        flights: InFlight,
        preference: Preference,
        ladder: Mapping[str, bool],
        live: LiveView,
    ) -> None:
        self.schedule = schedule
        self.start_ms = start_ms
        self._now_ms = now_ms
        self._tally = tally
        self._flights = flights
        self._preference = preference
        self._ladder = ladder
        self._live = live
        self._heap: list[tuple[int, int, Any]] = []
        self._seq = itertools.count()
        self._tenants: dict[str, tuple[str, ...]] = {}
        self._entries = {entry.name: entry for entry in schedule.entries}
        self._caught_up: dict[str, list[int]] = {}
        """Per entry: occurrences left by the catch-up policy, first and last, not said yet."""
        self._reached: list[tuple[int, tuple[Group, int]]] = []
        """Occurrences popped to expand ahead of time, none of whose firings is due yet:
        expanded after the wake's dispatch (:meth:`expand_reached`)."""
        self._placed_under = preference.view.digest
        """The view the firings placed ahead were ranked under (:meth:`follow_view`)."""
        self._fresh: list[Firing] = []
        """Plain firings expanded in this wake, placed once every occurrence it reached is
        expanded (:meth:`_place_fresh`): an instant's firings are ranked together."""
        self._waited: dict[str, int] = {}
        """The firings (and fan-outs, :func:`_fan_key`) waiting for the live head, each
        with when it is looked at again: one that is late by then is decided
        ``stale_schedule``, which says why; one late only because the node looked again
        later than that (a freeze) stays ``late``."""
        self._plan()

    def next_wake_ms(self) -> int | None:
        """When the next item is due, in epoch milliseconds."""
        if self._reached:  # left by a wake that failed before expanding them
            return min(at_ms for at_ms, _ in self._reached)
        return self._heap[0][0] if self._heap else None

    def items(self) -> Iterable[tuple[int, Any]]:
        """What the heap holds, each with when it is due, in no order."""
        return ((at_ms, item) for at_ms, _, item in self._heap)

    def add(self, at_ms: int, firing: Firing) -> None:
        """Have ``firing`` due at ``at_ms`` (a retry, a run-now)."""
        self._push(at_ms, firing)

    def defer(self, at_ms: int, firing: Firing) -> None:
        """Look again at ``firing``, left to others, at ``at_ms``."""
        self._push(at_ms, Deferred(firing))

    def _push(self, at_ms: int, item: Any) -> None:
        heapq.heappush(self._heap, (at_ms, next(self._seq), item))

    # -- planning and expanding -----------------------------------------------------

    def _plan(self) -> None:
        """Group the enabled entries by trigger within its window, and queue each group's
        first claimable occurrence."""
        groups: dict[Trigger, Group] = {}
        for entry in self.schedule.entries:
            if not entry.enabled:
                continue
            group = groups.get(entry.windowed)
            if group is None:
                group = groups[entry.windowed] = Group(entry.windowed, [], iter(()))
            group.entries.append(entry)
        for group in groups.values():
            group.occurrences = Occurrences(group.trigger, self.start_ms - group.reach_ms)
            self._queue_next(group)

    def plan_live(self, fresh: Iterable[tuple[Entry, int]]) -> None:
        """Queue each new live definition from its fence (``(entry, fence_ms)``): never an
        occurrence before it (rule 2); caught up at start like a code entry."""
        for entry, fence_ms in fresh:
            self._entries[entry.name] = entry
            if not entry.enabled:
                continue  # known, schedules nothing
            group = Group(entry.windowed, [entry], iter(()), live=True)
            since = max(fence_ms - 1, self.start_ms - entry.max_late_ms)
            group.occurrences = Occurrences(entry.windowed, since)
            self._queue_next(group)

    def _queue_next(self, group: Group) -> int | None:
        """Queue the group's next occurrence, and return it."""
        occurrence = next(group.occurrences, None)
        if occurrence is not None and group.live and self._live.ended(group.entries[0], occurrence):
            return None  # a later revision took this definition's place
        if occurrence is not None:
            self._push(occurrence - self._expand_ahead_ms(group), (group, occurrence))
        return occurrence

    def _expand_ahead_ms(self, group: Group) -> int:
        """Big fan-outs start preparing early enough to be ready at their occurrence."""
        widest = max(len(self._tenants.get(e.name) or _known(e.tenants)) for e in group.entries)
        return EXPAND_AHEAD_MS + prepare_ahead_ms(widest)

    def _expand(self, group: Group, occurrence: int) -> None:
        """Turn one occurrence of a trigger into the firings of every entry and tenant."""
        following = self._queue_next(group)
        for entry in group.entries:
            if occurrence < self.start_ms - entry.max_late_ms:
                continue  # before this node's time: not ours to judge
            if not self._live.current(entry, occurrence):
                continue  # another definition is in force at this occurrence
            if occurrence < self.start_ms and self._not_caught_up(entry, occurrence, following):
                continue
            base = self.schedule.address(entry)
            tenants = self.tenants_of(entry)
            if tenants is None:
                firing = Firing.of(entry, None, base, occurrence)
                left = self._caught_up.get(entry.name)
                if occurrence < self.start_ms and left is not None:
                    self._flights.coalesce(firing, left[1], left[2])
                self._preference.count(firing.release_ms)
                self._fresh.append(firing)
            elif len(tenants) > MAX_TENANTS:
                logger.error(
                    "entry %s: %d tenants, over the %d one fan-out can hold; occurrence %s skipped",
                    shown(entry.name),
                    len(tenants),
                    MAX_TENANTS,
                    iso(occurrence),
                )
            elif tenants:
                self._push(self._now_ms(), FanOut(entry, base, occurrence, tenants))

    def _not_caught_up(self, entry: Entry, occurrence: int, following: int | None) -> bool:
        """Whether the entry's catch-up policy leaves this occurrence, from before the
        node's start, unclaimed: ``none`` leaves every such occurrence, ``latest`` all but
        the last of them (the others are coalesced into it), ``all`` none. Counted as
        ``catch_up_skipped`` and said once per entry (:meth:`say_catch_up`)."""
        policy = entry.catch_up
        if policy == "all":
            return False
        if policy == "latest" and (following is None or following >= self.start_ms):
            return False
        known = entry.tenants if isinstance(entry.tenants, tuple) else None
        self._tally.caught_up(entry.name, len(known or self._tenants.get(entry.name) or (None,)))
        skipped = self._caught_up.setdefault(entry.name, [0, occurrence, occurrence])
        skipped[0] += 1
        skipped[2] = occurrence
        return True

    def say_catch_up(self) -> None:
        """One INFO line per entry whose catch-up policy left occurrences unclaimed."""
        if not self._caught_up:  # every wake but those after a catch-up
            return
        for name, (count, first, last) in self._caught_up.items():
            entry = self._entries[name]
            kept = "the latest is claimed" if entry.catch_up == "latest" else "none is claimed"
            logger.info(
                "entry %s: %d occurrence(s) from %s to %s, before this node started, left "
                "unclaimed by catch_up=%r (%s); counted as catch_up_skipped",
                shown(name),
                count,
                iso(first),
                iso(last),
                entry.catch_up,
                kept,
            )
        self._caught_up.clear()

    def _skip_late(self, group: Group, occurrence: int | None, now: int) -> int | None:
        """After a clock jump or a long freeze, skip in one step all but the last of the
        occurrences that are late for every entry of the group; count them, say so once.
        An occurrence at or before a claim the store refused, and still in its memory, is
        not skipped: its firings are expanded and, late, asked about (another node may
        not have sent them either: :meth:`InFlight.judging`)."""
        horizon = now - group.reach_ms
        skipped = 0
        while occurrence is not None and occurrence <= horizon:
            if self._flights.refused_after(occurrence) and occurrence > now - group.memory_ms:
                break
            following = next(group.occurrences, None)
            if following is None or following > horizon:
                # The last late one is expanded and reported firing by firing.
                if following is not None:
                    group.occurrences = itertools.chain((following,), group.occurrences)
                break
            skipped += 1
            occurrence = following
        if skipped:
            for entry in group.entries:
                known = entry.tenants if isinstance(entry.tenants, tuple) else None
                fanout = len(known or self._tenants.get(entry.name) or (None,))
                self._tally.late(entry.name, skipped * fanout)
                logger.warning(
                    "entry %s: %d occurrence(s) of %s were more than max_late behind the "
                    "clock (frozen node or clock jump) and were skipped as late",
                    shown(entry.name),
                    skipped,
                    group.trigger.describe(),
                )
        return occurrence

    def tenants_of(self, entry: Entry) -> tuple[str, ...] | None:
        """The tenants of a fan-out entry (the last list its callable returned, if it
        fails now); ``None`` for an entry that is not a fan-out."""
        if entry.tenants is None:
            return None
        try:
            tenants = entry.tenant_list()
        except Exception:
            if self._tally.may_warn(f"tenants {entry.name}", TENANTS_WARN_EVERY_MS):
                logger.exception(
                    "entry %s: the tenants callable failed; using the last list it returned "
                    "(said at most once a minute while it fails)",
                    shown(entry.name),
                )
            return self._tenants.get(entry.name, ())
        self._tenants[entry.name] = tenants  # type: ignore[assignment]
        return tenants

    def run_now(self, controls: Iterable[Control], now: int) -> None:
        """Queue a manual firing of each run-now request the board read: claimed like
        any other, so exactly one node sends it."""
        for control in controls:
            entry = self._live.entry_at(control.entry, now) or self._entries.get(control.entry)
            if entry is None:
                logger.warning(
                    "run-now of entry %s by %s on %s ignored: this node's schedule has no "
                    "such entry",
                    shown(control.entry),
                    shown(control.by),
                    shown(control.host),
                )
                continue
            tenants: tuple[str | None, ...] = (
                (control.tenant,)
                if control.tenant is not None or entry.tenants is None
                else (self.tenants_of(entry) or ())
            )
            for tenant in tenants:
                address = self.schedule.address(entry, tenant)
                scheduled = Firing.of(entry, tenant, address, control.at_ms)
                self._push(now, manual_firing(scheduled, control.request))
            logger.info(
                "run-now of entry %s (tenant %s) by %s on %s: %d manual firing(s) queued",
                shown(entry.name),
                shown(control.tenant),
                shown(control.by),
                shown(control.host),
                len(tenants),
            )

    # -- what is due ----------------------------------------------------------------

    def pop_due(self, now: int, decide: Decide) -> list[Firing]:
        """The firings due now, at most ``MAX_BATCH``; the late ones are handed to
        ``decide`` at once, without a store call, however many there are (and a
        firing left to others that went late, ``delegated``). An occurrence reached for
        expanding ahead of time is kept for :meth:`expand_reached` unless it is due now
        (a catch-up, a clock jump): then its firings are among those returned."""
        self.expand_reached(now)  # any a failed wake left
        due: list[Firing] = []
        later: list[tuple[int, Any]] = []  # back into the heap after this wake
        while self._heap and self._heap[0][0] <= now and len(due) < MAX_BATCH:
            at_ms, _, item = heapq.heappop(self._heap)
            if isinstance(item, Deferred | Firing) and not self._in_force(item, now, later, decide):
                continue
            if isinstance(item, Deferred):
                if now - item.firing.occurrence_ms > item.firing.entry.max_late_ms:
                    decide(item.firing, "delegated")  # left to others; missed if not
                else:
                    due.append(item.firing)
            elif isinstance(item, Firing):
                if now - item.occurrence_ms > item.entry.max_late_ms:
                    stale = self._went_stale(item.id, item.occurrence_ms, item.entry.max_late_ms)
                    decide(item, "stale_schedule" if stale else "late")
                else:
                    due.append(item)
                self._waited.pop(item.id, None)
            elif isinstance(item, FanOut):
                self._take_fan_out(item, now, due, later)
            elif item[1] > now:
                self._reached.append((at_ms, item))  # nothing of it is due yet
            else:
                self._expand_at(item, now)
                self._place_fresh(now)  # due now (a catch-up, a clock jump): in this wake
        for at_ms, item in later:
            self._push(at_ms, item)
        return due

    def expand_reached(self, now: int) -> None:
        """Expand the occurrences :meth:`pop_due` reached ahead of time: after the wake's
        dispatch, the work of a wake that is not due to the store at its instant. An
        expansion queues its trigger's next occurrence, which may be reached already (a
        trigger more frequent than ``EXPAND_AHEAD_MS``): expanded too."""
        heap = self._heap
        while self._reached:
            reached, self._reached = self._reached, []
            for _, item in reached:
                self._expand_at(item, now)
            while heap and heap[0][0] <= now and isinstance(heap[0][2], tuple):
                at_ms, _, item = heapq.heappop(heap)
                self._reached.append((at_ms, item))
        self._place_fresh(now)

    def _place_fresh(self, now: int) -> None:
        """Push the plain firings just expanded: each at its release, but one this node is
        not preferred for at its first look (:meth:`Preference.place
        <beatless.node._prefer.Preference.place>`), so it does not wake at that release."""
        fresh, self._fresh = self._fresh, []
        preference, ladder = self._preference, self._ladder
        for firing in fresh:
            placed, ranked = preference.place(
                firing.id, firing.release_ms, now, ladder=ladder[firing.entry.name]
            )
            if placed < 0 or placed <= firing.release_ms:  # claim (or delegate) when due
                self._push(firing.release_ms, firing)
            else:
                if ranked is not None:
                    self._flights.rank(firing, ranked)
                self._push(placed, Deferred(firing))

    def follow_view(self, now: int) -> None:
        """When the node's view changed, the firings placed ahead at a later look under
        the last one are due at their release again, ranked then under the new view."""
        digest = self._preference.view.digest
        if digest != self._placed_under:
            self._placed_under = digest
            self._unrank(now)

    def _unrank(self, now: int) -> None:
        moved = False
        for index, (_, seq, item) in enumerate(self._heap):
            if isinstance(item, Deferred) and item.firing.release_ms > now:
                self._heap[index] = (item.firing.release_ms, seq, item.firing)
                moved = True
        if moved:
            heapq.heapify(self._heap)

    def _expand_at(self, item: tuple[Group, int], now: int) -> None:
        group, occurrence = item
        found = self._skip_late(group, occurrence, now)
        if found is not None:
            self._expand(group, found)

    def _went_stale(self, key: str, occurrence_ms: int, max_late_ms: int) -> bool:
        """Whether what ``key`` names waited for the live head and was late at its next
        look as planned: the wait, not the node, made it late."""
        look_ms = self._waited.get(key)
        return look_ms is not None and look_ms - occurrence_ms > max_late_ms

    def _in_force(
        self, item: Firing | Deferred, now: int, later: list[tuple[int, Any]], decide: Decide
    ) -> bool:
        """Whether a due firing may go on: built under the definition in force at its
        occurrence (else dropped, counted ``unscheduled``), and the live head read
        recently enough to know it (else looked at again in ``WAIT_MS``, and decided
        ``stale_schedule`` once late). A manual firing (run-now) is a control: always."""
        firing = item.firing if isinstance(item, Deferred) else item
        if firing.manual:
            return True
        if not self._live.current(firing.entry, firing.occurrence_ms):
            self._flights.finish(firing)
            self._tally.of(firing.entry.name).unscheduled += 1
            return False
        if self._live.confirms(firing.occurrence_ms):
            return True
        if now - firing.occurrence_ms > firing.entry.max_late_ms:
            self._waited.pop(firing.id, None)
            decide(firing, "stale_schedule")
        else:
            self._waited[firing.id] = now + WAIT_MS
            later.append((now + WAIT_MS, item))
        return False

    def _fan_out_in_force(self, fan: FanOut, now: int, later: list[tuple[int, Any]]) -> bool:
        """Whether a fan-out may go on, as :meth:`_in_force` says of a firing; its firings
        are dropped whole (counted, one WARNING) where a firing would be decided."""
        if not self._live.current(fan.entry, fan.occurrence_ms):
            self._tally.of(fan.entry.name).unscheduled += fan.drop()
            return False
        if self._live.confirms(fan.occurrence_ms):
            return True
        if now - fan.occurrence_ms > fan.entry.max_late_ms:
            self._waited.pop(_fan_key(fan), None)
            count = fan.drop()  # dropped whole: no decision per firing, one WARNING
            if count > 0:
                self._tally.stale(fan.entry.name, count, fan.occurrence_ms)
        else:
            self._waited[_fan_key(fan)] = now + WAIT_MS
            later.append((now + WAIT_MS, fan))
        return False

    def _take_fan_out(
        self, fan: FanOut, now: int, due: list[Firing], later: list[tuple[int, Any]]
    ) -> None:
        """Prepare one chunk of a fan-out, or take the firings it has released by now."""
        if not self._fan_out_in_force(fan, now, later):
            return
        waited = False
        if self._waited:  # else nothing waited for the live head (every wake with due)
            key = _fan_key(fan)
            waited = self._went_stale(key, fan.occurrence_ms, fan.entry.max_late_ms)
            self._waited.pop(key, None)
        if now - fan.occurrence_ms > fan.entry.max_late_ms:
            count = fan.drop()  # dropped whole: no decision per firing, one WARNING
            if count > 0:
                tell = self._tally.stale if waited else self._tally.late
                tell(fan.entry.name, count, fan.occurrence_ms)
            return
        ranking = self._preference.ranking(self._ladder[fan.entry.name])
        if fan.view is not None and (ranking is None or ranking.digest != fan.view):
            fan.unrank()  # the view changed: place every firing at its release
        if not fan.is_prepared:
            fan.prepare(ranking)
            if not fan.is_prepared:
                later.append((now, fan))  # one chunk per wake: the loop stays on time
                return
        due.extend(fan.take(now, MAX_BATCH - len(due)))
        if not fan.remaining:
            return
        next_ms = fan.next_release_ms()
        if next_ms <= now:
            # Due firings left over from a full wake: they follow at once, and the
            # cursor's place in the heap holds this node's progress back until then.
            later.append((next_ms, fan))
        else:
            self._push(max(next_ms, now + FAN_OUT_STEP_MS), fan)

    # -- stopping ---------------------------------------------------------------------

    def bring_forward(self, until_ms: int, now: int, *, held: bool) -> None:
        """Make due at ``now`` the firings released by ``until_ms`` that wait for a later
        look: the ones tried again, and with ``held`` those seen held by another node's
        pending claim (its holder may have given them up). For the wakes of a stopping
        loop (:mod:`beatless.node._drain`)."""
        moved = False
        for index, (at_ms, seq, item) in enumerate(self._heap):
            if (
                at_ms > now
                and isinstance(item, Firing)
                and item.release_ms <= until_ms
                and (held or not self._flights.was_held(item))
            ):
                self._heap[index] = (now, seq, item)
                moved = True
        if moved:
            heapq.heapify(self._heap)

    def left(self, until_ms: int) -> tuple[int, int]:
        """What this node has still to try of the firings released by ``until_ms``: the
        firings (not those seen held by another node's claim: their holder decides them)
        and the fan-outs or occurrences with firings released by then."""
        firings = groups = 0
        for _, _, item in self._heap:
            if isinstance(item, Firing):
                firings += item.release_ms <= until_ms and not self._flights.was_held(item)
            elif isinstance(item, FanOut):
                if item.remaining:
                    first = item.next_release_ms() if item.is_prepared else item.occurrence_ms
                    groups += first <= until_ms
            elif not isinstance(item, Deferred):  # (group, occurrence): not expanded yet
                groups += item[1] <= until_ms
        return firings, groups

    def upcoming(self, until_ms: int, limit: int, wanted: Callable[[Firing], bool]) -> list[Firing]:
        """At most ``limit`` firings due by ``until_ms`` that are ``wanted`` (and staged
        firings of prepared fan-outs): the heap's items up to then are a subtree at its
        top."""
        heap, below = self._heap, [0]
        found: list[Firing] = []
        while below and len(found) < limit:
            i = below.pop()
            if i >= len(heap) or heap[i][0] > until_ms:
                continue
            item = heap[i][2]
            if isinstance(item, Firing):
                if wanted(item):
                    found.append(item)
            elif isinstance(item, FanOut) and item.is_prepared:
                found += item.stage(until_ms, limit - len(found))
            below += (2 * i + 2, 2 * i + 1)
        return found


def _fan_key(fan: FanOut) -> str:
    """A fan-out's key among the firing ids of :attr:`Timeline._waited`."""
    return f"fan-out:{fan.base}@{fan.occurrence_ms}"
