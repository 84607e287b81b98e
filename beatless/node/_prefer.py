"""The preferred claimer: which node of the fleet claims a firing, so that one does.

Without it every node claims every firing, and the store's work grows with the fleet. With
it, each node ranks the live nodes of the registry for each firing by rendezvous hashing
(every node computes the same ranking from the same view) and:

* rank 0, the *preferred* node, claims at the release, as before;
* rank 1 claims at the release + ``GRACE_MS``, rank 2 at + 2 × ``GRACE_MS``, but only if
  the preferred node's *progress* does not show that it dealt with the firing (each looks
  ``LOOK_SHIFT_MS`` after its rung: off the whole seconds, where releases fall);
* a node ranked ``RUNGS`` or lower never claims while the nodes above it are in the
  registry: it looks again every ``REGISTRY_EVERY_MS``, and when those nodes have left
  the members (dead, frozen, cut off: their notes ran out,
  :mod:`beatless.fleet._members`) it is ranked higher and claims.

**What is ranked.** A plain firing is ranked by its release instant (:func:`instant_key`):
the firings of one schedule released at one instant all go to one preferred node, so one
process wakes and sends at that instant while the others sleep through it (each wakes
only at its rung, placed there ahead of the release by the timeline). An instant of more
than ``INSTANT_GROUP`` firings (a burst) is split into groups of about that many, each
ranked on its own, so that the fleet shares it out. A fan-out's tenants are ranked each by
its own key (:func:`lane_of`): their releases are spread over a window already.

A node reads the progress of the node ranked first for a firing it waits on, in the
syncs ``PROGRESS_LEAD_MS`` before its next look, at most ``PROGRESS_READ_MAX`` nodes a
sync (:meth:`Preference.wanted`): never the whole fleet's. A progress it could not read
in time only makes it claim at its rung, or look again later.

The claim still decides everything: two nodes claiming one firing is as safe as ever
(one wins), so a stale or disagreeing view costs a claim, never a duplicate. This is a
preference that cuts work, not an election.

**Progress.** A node's progress note says: under the view with digest ``view``, adopted at
``since_ms`` on its clock, every firing it was preferred for with a release up to
``until_ms`` has a claim record in the store that is final (won, lost), or was dropped
because late or paused. Firings it could not claim (store down, enqueue failed, clock
off) hold ``until_ms`` below their release until they are decided. A firing it found
held, pending under another node's claim, is not done either (the holder may have died
before it sent): the note lists it (``held``, up to ``HELD_LISTED`` of them; beyond,
they hold ``until_ms`` back too), the lower ranks claim it at their rungs, find it held
as well, and every node that saw it held looks again when the holder's lease could have
run out. Should the preferred node die meanwhile, the firing is still taken over.

A lower-ranked node trusts that note only for a view with the same digest as its own,
so when views disagree (a node joined or left and not every node has read the registry
yet) the lower ranks simply claim.

**The ladder fits inside max_late.** When the preferred node and the ones after it die at
once, the others see it only when their records run out (``REGISTRY_TTL_MS``) and they
read the registry again (every ``REGISTRY_EVERY_MS``); a firing is then claimed at most
``LADDER_MS`` after its release. An entry uses the preferred claimer only when its jitter
plus ``LADDER_MS`` fit within its ``max_late``; other entries are claimed by every node at
the release, as without it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from beatless.fleet._controls import json_text
from beatless.fleet._members import PROGRESS_READ_MAX
from beatless.fleet._notes import REGISTRY_EVERY_MS, REGISTRY_TTL_MS, NodeRecord, progress_kind
from beatless.fleet._schema import PROGRESS, BadNote, Skipped, parse_each
from beatless.schedule._fanout import Ranking
from beatless.schedule.outcomes import DecisionOutcome

# An Enum class's attribute is a slow look-up on Python 3.11 (EnumType.__getattr__): the
# path of every claim names these through module names.
_SETTLED = DecisionOutcome.SETTLED

GRACE_MS = 3_000
"""How long after the rung above a lower-ranked node waits: the preferred node's progress
is posted within a second of its claim and read by the others within another (``SYNC_EVERY_MS``),
so 3 s leaves room for a slow store."""
RUNGS = 3
"""How many ranks claim on a timer (0, 1, 2); the others wait for the registry."""
HELD_LISTED = 32
"""How many held firings a progress note lists by id; more hold its ``until_ms`` back."""
PROGRESS_KEPT = 256
"""How many other nodes' progress a node keeps, the last read."""
PROGRESS_LEAD_MS = 1_500
"""A node reads the progress a firing waits on in the syncs this long before its look
(the rung, or the next look of a node ranked below the rungs): late enough that the
preferred node has posted it, and at two syncs at least."""
INSTANT_GROUP = 100
"""At most about this many plain firings released at one instant go to one preferred node
(:func:`instant_key`): a steady schedule's instant goes to one node, a burst of 10,000
to a hundred groups shared out over the fleet."""
BIG_INSTANTS_KEPT = 256
"""How many instants holding more than ``INSTANT_GROUP`` firings keep their count once
released (a firing looked at again after a view change is ranked by it)."""
KEYS_KEPT = 1_024
"""How many instants' keys keep their rank (a burst of 10,000 has 100)."""
FORGET_EVERY_MS = 1_000
"""How often the counts of released instants are dropped."""
LOOK_SHIFT_MS = 250
"""A lower rank looks this long after its rung's whole seconds: most schedules release on
whole seconds, when the preferred nodes send, and a look is work the node does then."""
LADDER_MS = REGISTRY_TTL_MS + 2 * REGISTRY_EVERY_MS + LOOK_SHIFT_MS + 750
"""The latest, after its release, that a firing is claimed when every node above a live
one died: their records run out, the live node reads the registry and looks again (its
looks ``LOOK_SHIFT_MS`` off the whole seconds), and claims (three quarters of a second
for the claim itself): 26 s."""

_MASK = (1 << 64) - 1


def fits(jitter_ms: int, max_late_ms: int) -> bool:
    """Whether an entry's firings can be left to a preferred node: the whole ladder, after
    the latest release, is within ``max_late`` of the occurrence."""
    return jitter_ms + LADDER_MS <= max_late_ms


def salt(node: str) -> int:
    """A node's 64-bit key for rendezvous hashing."""
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")


_GOLDEN = 0x9E3779B97F4A7C15


def scores(firing: int, salts: tuple[int, ...]) -> list[int]:
    """The rendezvous score of each node for a firing: a multiplicative hash of the two
    keys, its high bits folded into the low ones; the highest score claims first. Both
    keys are SHA-256 bits, so one multiply spreads them well (each of 50 nodes comes first
    for 2 % ± 0.2 % of 50,000 random firings), at a third of the cost of a full mixer:
    every node scores every firing against every node."""
    products = [((firing ^ s) * _GOLDEN) & _MASK for s in salts]
    return [x ^ (x >> 29) for x in products]


def instant_key(release_ms: int, key: int, count: int) -> int:
    """The 64-bit key a plain firing is ranked by: its release instant, so that one node is
    preferred for every firing released at that instant and one node wakes for it, not
    each; when ``count`` firings share the instant, in ``ceil(count / INSTANT_GROUP)``
    groups by the firing's own ``key``, each ranked on its own (a burst is shared out)."""
    groups = max(1, -(-count // INSTANT_GROUP))
    text = f"{release_ms}/{key % groups}" if groups > 1 else str(release_ms)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def firing_key(firing_id: str) -> int:
    """The 64-bit key of a firing, from its id (the first 64 bits of its SHA-256, written
    as a UUID)."""
    return int(firing_id[:8] + firing_id[9:13] + firing_id[14:18], 16)


@dataclass(frozen=True, slots=True)
class View:
    """The nodes this node ranks firings among, since when, and a digest that others
    compare with theirs."""

    nodes: tuple[str, ...]
    salts: tuple[int, ...]
    digest: str
    since_ms: int

    @classmethod
    def of(cls, nodes: set[str], since_ms: int) -> View:
        ordered = tuple(sorted(nodes))
        digest = hashlib.sha256("\n".join(ordered).encode()).hexdigest()[:16]
        return cls(ordered, tuple(salt(n) for n in ordered), digest, since_ms)

    def rank(self, firing_id: str, node: str) -> tuple[int, str]:
        """Where ``node`` stands for the firing (0 first), and which node stands first."""
        return self.rank_key(firing_key(firing_id), node)

    def rank_key(self, key: int, node: str) -> tuple[int, str]:
        """Where ``node`` stands for a 64-bit ranking key (:func:`instant_key`), and which
        node stands first."""
        ranked = scores(key, self.salts)
        mine = ranked[self.nodes.index(node)]
        return sum(s > mine for s in ranked), self.nodes[ranked.index(max(ranked))]


LANE_DELAYS_MS = (0, GRACE_MS, 2 * GRACE_MS, RUNGS * GRACE_MS)
"""When a fan-out hands out, after the release, the firings a node ranks 0, 1, 2 and
``RUNGS`` or lower for (:class:`beatless.schedule._fanout.Ranking`): at the rung where it would
look at them first."""


def lane_of(salts: tuple[int, ...], me: int) -> Callable[[int], int]:
    """Where node ``me`` (its place in ``salts``) ranks for a firing, from the firing's
    64-bit key, capped at ``RUNGS``: :meth:`View.rank`'s rank, without the id's text."""
    mine_salt = salts[me]
    others = salts[:me] + salts[me + 1 :]

    def lane(key: int) -> int:
        mine = ((key ^ mine_salt) * _GOLDEN) & _MASK
        mine ^= mine >> 29
        rank = 0
        for other in others:
            x = ((key ^ other) * _GOLDEN) & _MASK
            if x ^ (x >> 29) > mine:
                rank += 1
        return min(rank, RUNGS)

    return lane


def live_view(me: str, fingerprint: str, registry: list[NodeRecord], since_ms: int) -> View:
    """The view from a registry read: this node, and the live nodes that run the same
    schedule (same fingerprint) and whose loop is healthy. Nodes of another schedule
    version rank among themselves, so each version has its preferred claimers."""
    nodes = {r.node for r in registry if r.fingerprint == fingerprint and r.health() is None}
    return View.of(nodes | {me}, since_ms)


@dataclass(frozen=True, slots=True)
class Progress:
    """A node's progress note (see the module docstring)."""

    view: str
    since_ms: int
    until_ms: int
    held: frozenset[str] = frozenset()
    """Firings the node found held by another node's pending claim: not dealt with."""

    def covers(self, view: View, release_ms: int, firing_id: str = "") -> bool:
        """Whether this progress, read by a node whose view is ``view``, shows that the
        firing released at ``release_ms`` was dealt with by its preferred node."""
        return (
            self.view == view.digest
            and self.since_ms <= release_ms <= self.until_ms
            and firing_id not in self.held
        )

    def to_json(self) -> str:
        data: dict[str, object] = {
            "view": self.view,
            "since_ms": self.since_ms,
            "until_ms": self.until_ms,
        }
        if self.held:
            data["held"] = sorted(self.held)
        return json_text(data)

    @classmethod
    def parse(cls, text: str) -> Progress:
        """The progress, checked against :data:`~beatless.fleet._schema.PROGRESS`; raises
        :class:`~beatless.fleet._schema.BadNote`."""
        data = PROGRESS.load(text)
        held = frozenset(data.get("held", ()))
        return cls(data["view"], data["since_ms"], data["until_ms"], held)

    @classmethod
    def from_json(cls, text: str) -> Progress | None:
        """The progress, or ``None`` for a note that does not fit its schema."""
        try:
            return cls.parse(text)
        except BadNote:
            return None


Want = tuple[int, int, int, bool]
""":meth:`Preference.wanted`: the first look, the last, the latest release, and whether a
rung waits on it."""


def _priority(want: Want, now_ms: int) -> tuple[bool, int]:
    """A rung's want first; then the looks due soonest (one past is due now: a node
    wanted for long does not stay first)."""
    first_ms, _, _, rung = want
    return not rung, max(first_ms, now_ms)


Ranked = tuple[str, int, str]
"""Where a node ranks for a firing: the view's digest, its rank, and the first node."""

CLAIM = -1
""":meth:`Preference.place`: claim the firing now."""
DELEGATE = -2
""":meth:`Preference.place`: the preferred node dealt with the firing; leave it."""


class Preference:
    """One node's side of the preferred claimer: its view, the others' progress, its own.

    The loop calls :meth:`adopt`, :meth:`place`, :meth:`decided` and :meth:`advance`; the
    node's board thread hands it the registry and the progress notes it reads, and posts
    :meth:`note`.
    """

    def __init__(self, node: str, fingerprint: str, namespace: str, *, enabled: bool) -> None:
        self.node = node
        self.fingerprint = fingerprint
        self.enabled = enabled
        self.kind = progress_kind(namespace)
        self.view = View.of({node}, 0)
        self.registry: list[NodeRecord] | None = None
        """The registry as the board last read it; the loop adopts it at its next wake."""
        self.progress: dict[str, Progress] = {}
        """The other nodes' progress, as the board last read it."""
        self.until_ms: int | None = None
        self._adopted: list[NodeRecord] | None = None
        self._owned: dict[str, tuple[int, int]] = {}
        """Firings this node was preferred for and has not settled: release, and when
        they are late (and no longer hold the progress back)."""
        self._held: dict[str, tuple[int, int]] = {}
        """Of those, the ones found held by another node's pending claim: listed in the
        note (the first ``HELD_LISTED`` by release) rather than holding it back."""
        self.held: frozenset[str] = frozenset()
        self._posted: Progress | None = None
        self._ranking: Ranking | None = None
        self._lock = threading.Lock()
        self._instants: dict[int, int] = {}
        """How many plain firings are released at each instant not passed yet (and at the
        last big ones): :meth:`count`."""
        self._forgot_ms = 0
        self._keys: dict[int, Ranked] = {}
        """Where this node ranks for the last instants' keys (:meth:`ranked`)."""
        self._wanted: dict[str, Want] = {}
        """The nodes first for firings this node waits on, with when it looks again at
        the first and at the last of them, the latest release among them, and whether
        one of them waits for its rung."""

    def adopt(self, now_ms: int) -> None:
        """Take the registry the board read last into the view, from ``now_ms``."""
        registry = self.registry
        if registry is None or registry is self._adopted:
            return
        self._adopted = registry
        view = live_view(self.node, self.fingerprint, registry, now_ms)
        if view.digest != self.view.digest:
            self.view = view

    def place(
        self,
        firing_id: str,
        release_ms: int,
        now_ms: int,
        *,
        ladder: bool,
        plain: bool = True,
        ranked: Ranked | None = None,
    ) -> tuple[int, Ranked | None]:
        """What to do with a due firing: :data:`CLAIM` it now, :data:`DELEGATE` it, or look
        again at the time returned; and where it ranks, to pass back as ``ranked`` then (it
        is computed again only if the view changed). ``ladder`` is whether its entry fits
        the ladder (and the firing is a scheduled one, not manual); ``plain``, whether it is
        a plain firing (ranked by its instant), not a fan-out's. Placed ahead of its
        release (``now_ms`` before it), a firing this node is not preferred for is looked
        at first at its rung, or ``REGISTRY_EVERY_MS`` after its release."""
        view = self.view
        if not self.enabled or not ladder or len(view.nodes) == 1:
            return CLAIM, None
        if ranked is None or ranked[0] != view.digest:
            ranked = self.ranked(firing_id, release_ms, plain=plain)
        _, rank, top = ranked
        if rank == 0:
            return CLAIM, ranked
        progress = self.progress.get(top)
        if progress is not None and progress.covers(view, release_ms, firing_id):
            return DELEGATE, ranked
        if rank < RUNGS:
            rung = release_ms + rank * GRACE_MS
            if now_ms >= rung:
                return CLAIM, ranked
            self._want(top, rung + LOOK_SHIFT_MS, release_ms, rung=True)
            return rung + LOOK_SHIFT_MS, ranked
        look = max(now_ms, release_ms) + REGISTRY_EVERY_MS + LOOK_SHIFT_MS
        self._want(top, look, release_ms, rung=False)
        return look, ranked

    def ranked(self, firing_id: str, release_ms: int, *, plain: bool = True) -> Ranked:
        """Where this node ranks, under its view, for the firing ``firing_id`` released at
        ``release_ms``: a ``plain`` one by its release instant (:func:`instant_key`), a
        fan-out's by its own key, as its lane (:func:`lane_of`)."""
        view = self.view
        key = firing_key(firing_id)
        if plain:
            key = instant_key(release_ms, key, self._instants.get(release_ms, 1))
            known = self._keys.get(key)
            if known is not None and known[0] == view.digest:
                return known  # an instant's firings, or a group's: ranked once
        ranked = (view.digest, *view.rank_key(key, self.node))
        if plain:
            if len(self._keys) >= KEYS_KEPT:
                self._keys.clear()
            self._keys[key] = ranked
        return ranked

    def count(self, release_ms: int) -> None:
        """One more plain firing is released at ``release_ms``; counted before any of that
        instant's firings is ranked (:meth:`ranked`), the timeline expanding them ahead."""
        instants = self._instants
        instants[release_ms] = instants.get(release_ms, 0) + 1

    def _forget_instants(self, now_ms: int) -> None:
        """Drop the counts of released instants, all but the last ``BIG_INSTANTS_KEPT`` of
        more than ``INSTANT_GROUP`` firings (a count of one or up to ``INSTANT_GROUP``
        ranks the same as none)."""
        big = []
        for instant, count in list(self._instants.items()):
            if instant < now_ms:
                if count > INSTANT_GROUP:
                    big.append(instant)
                else:
                    del self._instants[instant]
        for instant in sorted(big)[:-BIG_INSTANTS_KEPT]:
            del self._instants[instant]

    def _want(self, top: str, by_ms: int, release_ms: int, *, rung: bool) -> None:
        """A firing released at ``release_ms`` waits on ``top``'s progress until ``by_ms``
        (its next look; ``rung``: its rung, where it claims): the board reads that
        progress in the syncs just before."""
        with self._lock:
            held = self._wanted.get(top)
            if held is None:
                self._wanted[top] = (by_ms, by_ms, release_ms, rung)
            else:
                first, last, release, rungs = held
                self._wanted[top] = (
                    min(first, by_ms),
                    max(last, by_ms),
                    max(release, release_ms),
                    rungs or rung,
                )

    def wanted(self, now_ms: int, limit: int = PROGRESS_READ_MAX) -> list[str]:
        """The nodes whose progress to read at this sync: those a firing waits on with a
        look due within ``PROGRESS_LEAD_MS``, whose progress as last read does not cover
        them all yet; at most ``limit``, those a rung waits on first, then the looks due
        soonest. A want whose looks are all past, or covered, is dropped: a firing still
        waiting puts it back at its look."""
        view = self.view
        with self._lock:
            wanted = self._wanted
            for node, (_, last_ms, release_ms, _) in list(wanted.items()):
                progress = self.progress.get(node)
                covered = progress is not None and progress.covers(view, release_ms)
                if last_ms < now_ms or covered:
                    del wanted[node]
            soon = now_ms + PROGRESS_LEAD_MS
            due = [node for node, want in wanted.items() if want[0] <= soon]
            if len(due) > limit:
                due = sorted(due, key=lambda node: _priority(wanted[node], now_ms))[:limit]
        return due

    def ranking(self, ladder: bool) -> Ranking | None:
        """How a fan-out of an entry (``ladder``: one that fits the ladder) splits its
        firings into lanes on this node under the current view; ``None`` when every
        firing is claimed at its release (one node, or the preferred claimer off)."""
        view = self.view
        if not self.enabled or not ladder or len(view.nodes) == 1:
            return None
        if self._ranking is None or self._ranking.digest != view.digest:
            lane = lane_of(view.salts, view.nodes.index(self.node))
            self._ranking = Ranking(view.digest, lane, LANE_DELAYS_MS)
        return self._ranking

    def owns(self, firing_id: str, release_ms: int, *, plain: bool = True) -> bool:
        """Whether this node is the preferred one for the firing under its view."""
        view = self.view
        return len(view.nodes) == 1 or self.ranked(firing_id, release_ms, plain=plain)[1] == 0

    def decided(
        self, firing_id: str, release_ms: int, late_ms: int, outcome: str, *, plain: bool = True
    ) -> None:
        """A firing this node claimed was decided (or retried) with ``outcome``; ``plain``:
        not a fan-out's (:meth:`ranked`)."""
        self._owned.pop(firing_id, None)
        self._held.pop(firing_id, None)
        if outcome in _SETTLED or not self.enabled:
            return
        if not self.owns(firing_id, release_ms, plain=plain):
            return
        (self._held if outcome == "held" else self._owned)[firing_id] = (
            release_ms,
            late_ms,
        )

    def advance(self, now_ms: int, pending_ms: int | None) -> None:
        """After a wake: every firing preferred here and released by ``now_ms`` is settled,
        but those still owned and what is still due (``pending_ms``, the earliest item left
        due in the loop's heap)."""
        if now_ms - self._forgot_ms >= FORGET_EVERY_MS:
            self._forgot_ms = now_ms
            self._forget_instants(now_ms)
        until = now_ms if pending_ms is None or pending_ms > now_ms else pending_ms - 1
        for owned in (self._owned, self._held):
            for firing_id, (_, late) in list(owned.items()):
                if late < now_ms:
                    del owned[firing_id]
        for release, _ in self._owned.values():
            until = min(until, release - 1)
        held = sorted(self._held.items(), key=lambda item: item[1][0])
        for _, (release, _) in held[HELD_LISTED:]:
            until = min(until, release - 1)
        self.held = frozenset(firing_id for firing_id, _ in held[:HELD_LISTED])
        self.until_ms = until

    def note(self, *, refresh: bool) -> tuple[str, str, str] | None:
        """The progress to post (kind, key, value), if it changed or ``refresh``; ``None``
        when there is nothing to post."""
        if not self.enabled or self.until_ms is None:
            return None
        progress = Progress(self.view.digest, self.view.since_ms, self.until_ms, self.held)
        if progress == self._posted and not refresh:
            return None
        self._posted = progress
        return self.kind, self.node, progress.to_json()

    def read(
        self, notes: Mapping[str, str], skipped: Skipped | None = None, kind: str | None = None
    ) -> None:
        """Take the progress notes of others, as read, by node (those that do not fit their
        schema are told to ``skipped`` as of ``kind``, the progress kind by default): over
        those read before, the last ``PROGRESS_KEPT`` nodes read kept. A progress only
        grows under one view, so one read a few seconds ago still shows what it showed."""
        others = {node: text for node, text in notes.items() if node != self.node}
        read = parse_each(kind or self.kind, others, Progress.parse, skipped)
        progress = dict(self.progress)
        for node, parsed in read:
            progress.pop(node, None)
            progress[node] = parsed
        for node in list(progress)[: max(0, len(progress) - PROGRESS_KEPT)]:
            del progress[node]
        self.progress = progress  # one assignment: the loop reads it meanwhile
