"""The claim-store contract. Every store inherits these docstrings and passes one suite.

A claim is keyed by the firing id. For every firing id, across every node using the
same store, while the store remembers the claim:

* exactly one ``claim`` call returns :attr:`Outcome.WON` (or :attr:`Outcome.TAKEOVER`,
  below); every other returns :attr:`Outcome.HELD` while the winner's claim is pending
  and :attr:`Outcome.LOST` once it is committed;
* a new claim whose occurrence is more than ``max_late + 10 s`` behind the **store's**
  clock is refused with :attr:`Outcome.LATE` and writes nothing (stores with no clock
  of their own use the local clock, which all their users share); a new claim whose
  release is more than ``10 s`` ahead of the store's clock (a node whose clock runs
  fast) is refused with :attr:`Outcome.EARLY` and writes nothing;
* a claim is *pending* from ``claim`` until ``commit``: it lives for ``lease_ms`` on the
  store's clock. ``commit`` makes it *committed* and remembered for ``memory_ms`` from
  then. ``release`` ends a pending claim's lease at once (the record stays) so the
  firing can be claimed again;
* when a pending claim's lease runs out uncommitted (the winner died between claim and
  enqueue), or its holder released it (the enqueue failed), the next claim that is not
  late wins it as :attr:`Outcome.TAKEOVER`: a released claim is kept as a record whose
  lease has ended, never deleted, so a win after it is never mistaken for a first win;
* a node that claims a firing it already holds pending gets ``WON`` again, so a claim
  whose answer was lost in transit can be retried safely.

**Identity.** Each store has an *epoch*: a record written at first use, with a random
token and the store's clock at that instant, that disappears when the store loses its
memory (a Redis restarted without persistence, an SQLite file deleted). A store object
remembers the epoch it last saw (:attr:`ClaimStore.epoch`). When a claim finds the
epoch changed since, the store forgot claims it once held: a claim that is not held, and
whose release is before the new epoch's start plus ``10 s``, may have been won, and
enqueued, before the loss. It is written committed (so that no other node sends it
either) and answered :attr:`Outcome.FORGOTTEN`: a missed firing, loudly reported, is
preferred to a duplicate. The store object then adopts the new epoch but keeps that
cut-off, so a later batch (a retry, the next sub-batch) is judged the same way. A store
object that has not seen an epoch yet adopts the first one it sees, with no cut-off; a
commit never adopts a changed epoch. Use one store object per node.

**Re-seeding.** Forgetting the firings before the horizon loses every one nobody claimed
in time, though most were never sent. The nodes together know what they sent, so a
store object that :attr:`~ClaimStore.holds_off` (a node loop sets it, and then re-seeds)
answers such a firing :attr:`Outcome.RESEEDING` instead and writes nothing: the node
tries it again. Each node writes back the firings it sent recently with
:meth:`ClaimStore.reseed`, a claim judged as above (absent before the horizon: written
committed, ``FORGOTTEN``; a won one is committed at once), and says so in a note; once
every node the fleet knew has re-seeded (:mod:`beatless._reseed`), it calls
:meth:`ClaimStore.settle`, which drops the horizon: a firing still absent was sent by
nobody and is judged as new. A store object that does not hold off answers
``FORGOTTEN`` as before, and one that never settles keeps the horizon. The nodes must
agree on the epoch they re-seed for: a store whose epoch is made of parts, each met only
by a claim that lands in it (Redis Cluster: one per bucket), reads them all again at
:meth:`ClaimStore.recheck_epoch`, which a node calls before it writes back.

**Task tags.** A request carries a short tag of its entry's task
(:attr:`ClaimRequest.tag`), and the store keeps it in the claim record. A live claim
whose record has a tag other than the request's is answered :attr:`Outcome.FOREIGN`,
pending or committed, whichever node holds it (even the same node name): another task
holds this address, so two apps share one store and namespace. ``FOREIGN`` is never won
and counts as lost. A record without a tag (written by an earlier beatless) or a
request without one is never foreign. A record whose lease or memory ran out is free,
whatever its tag. A store that cannot read another node's claim without disturbing it
(RabbitMQ: fetching a slot's message opens the slot to a second claim) answers ``HELD``
or ``LOST`` there instead: the firing is lost all the same, only the warning is missing.

A live claim decides first: ``FOREIGN``, ``LOST``, ``HELD`` (or ``WON`` for the holder's
own pending claim) take precedence over ``LATE``, ``EARLY``, ``FORGOTTEN`` and
``OVERLAP``.

**Judging claims.** Since a live claim decides first, a claim can ask who holds a firing
without ever winning it: :func:`judging` gives the request an occurrence at the Unix
epoch and no lateness allowed, so a firing nobody holds live is answered ``LATE`` and
nothing is written, while a live claim answers as it always does: ``LOST`` (committed),
``HELD`` (another node's pending claim), ``FOREIGN``, ``CORRUPT``. The one claim it wins
is the asking node's own pending claim, renewed as any claim of its holder is. Nodes ask
so about the firings a full or refusing store kept them from judging
(:mod:`beatless.node._judging`).

**Live revisions.** A request may carry the live revision its node had applied
(:attr:`ClaimRequest.revision`). Memory, SQLite, Redis and PostgreSQL read, in the
claim's own script or transaction, the fence of the namespace's next revision (the kept
note ``r + 1`` of its revisions, :mod:`beatless.stores._fences`): when that revision
exists and its fence is at or before the occurrence, a claim that would be won or
renewed is answered :attr:`Outcome.STALE` and nothing is written, so no node sends an
occurrence at or past a fence with the values of an older revision. A live claim of
another node decides first, as for every outcome; ``LATE`` and ``EARLY`` come before
``STALE``, which comes before ``FORGOTTEN`` and ``OVERLAP``. Redis Cluster keeps the
revisions in a slot of their own, so it reads the note in the same pipeline as its claim
scripts and answers ``STALE`` for a claim the script won or renewed (left pending to the
node, whose next claim of it renews it). NATS and RabbitMQ do not check (never
``STALE``): there the nodes' propagation rule alone holds rule 6. A request without a
revision is never stale and costs no read.

**Claim records.** :meth:`ClaimStore.claim_records` reads what the store holds for some
firings, without judging or changing anything: the node that claimed each, whether it is
committed, until when, and the live revision the claim carried (:class:`ClaimRecord`),
so that ``beatless explain --store`` can say which revision a firing ran under. A record
is there while the store remembers the claim (its ``memory_ms`` past the commit, longer
where the store sweeps lazily), whatever its lease; a record the store cannot read is
left out. A record written by a beatless that did not keep the revision reads with
``revision`` ``None``, and such a beatless reads a record with one as it always did: the
revision sits where it never looks (see each store). A store that cannot read a claim
without disturbing it (RabbitMQ) says so (:attr:`ClaimStore.reads_claims` false) and
reads none.

**Renewal.** A node that claims a firing it holds pending gets ``WON`` with its lease
renewed: it lasts ``lease_ms`` from this claim. Run leases are built on this; a store
whose renewal leaves a gap in which another node could win says so
(:attr:`ClaimStore.holds_run_leases` false).

**Run leases and overlap.** A request may name the record of its address's run lease
(:attr:`ClaimRequest.run_id`, set when the entry's overlap policy is ``skip``). Workers
hold that record as a pending claim while a run of the address is in progress
(:mod:`beatless.node.runs`). A claim that would be won while that record is a live pending
claim is answered :attr:`Outcome.OVERLAP` instead, and the firing is written committed,
so no other node enqueues it either. A store that cannot read a record without
disturbing it does not check and never answers ``OVERLAP``
(:attr:`ClaimStore.checks_overlap` false): the worker's own run-lease check then
refuses the run, but the message is enqueued.

**Notes.** Beside the claims, a store keeps *notes*: small records with a time to live,
grouped by *kind* and named by *key* (:class:`Note`). Nodes use them for what the fleet
must see of itself: the registry of live nodes, each address's recent history, the
controls an operator sets. :meth:`ClaimStore.post` writes notes, replacing the note of
the same kind and key; a note lives ``ttl_ms`` from its post on the store's clock, both
ends included, and is never read after. A note with ``keep`` bounds its kind: once it
is written, only the ``keep`` notes of the kind that expire last are kept (between notes
that expire at the same millisecond, any). :meth:`ClaimStore.read_notes` returns the
live notes of the kinds asked. Kinds and keys are any text up to ``NOTE_NAME_LIMIT``
characters and values any text up to ``NOTE_VALUE_LIMIT`` bytes in UTF-8; the store
encodes them as it needs. Notes never change a claim's outcome, and a kind is shared by
every client of the store: callers put their namespace in the kind. A store that keeps
notes at most for a fixed time (a stream's retention) says so in
:attr:`ClaimStore.notes_live_ms` and refuses a longer ``ttl_ms`` with a
:class:`~beatless.errors.ConfigError`: a note that must live longer is posted again.

**Logged notes.** A note posted ``logged`` (:attr:`Note.logged`) belongs to a *log*: a
kind with a ``keep``, each key posted about once, in about the order its notes expire (an
address's history: a note per firing, living from its occurrence). A store may keep such
a kind as an append-only log, one append per note, trimmed in bulk, and compute the
kind's notes on each read: :meth:`ClaimStore.read_logs` reads them, with the kind's notes
posted in place (not logged: an earlier beatless, a fleet mid-rollout) beside them. A
reader sees what :meth:`ClaimStore.read_notes` would show of notes posted in place (the
last note of each key, live, at most ``keep`` of them, those that expire last) with two
differences: the bound may follow the order the notes were posted rather than when they
expire (the store keeps at least the last ``keep`` notes posted), and a key posted again
may take room in the log until it is trimmed, so fewer than ``keep`` keys may be read.
:meth:`ClaimStore.read_notes` reads the notes posted in place, and may or may not read
the logged ones. A store without logs (this default) posts a logged note as any other
and reads logs with ``read_notes``.

**Kept notes.** Beside the notes that expire, a store may keep notes until they are
replaced or deleted (:class:`KeptNote`): what must outlive any time to live, such as the
live entries of a schedule and their revisions (:mod:`beatless.live`), which *are* the
schedule rather than a cache of it. :meth:`ClaimStore.keep_notes` writes them, replacing
the kept note of the same kind and key (one transaction where the store has one);
:meth:`ClaimStore.read_kept` reads the kept notes of one kind (all of them, or only the
keys asked); :meth:`ClaimStore.delete_kept` deletes some, by key. Kinds, keys and values
follow the limits of notes, and kept notes are apart from notes: a kind of notes and a
kind of kept notes of the same name never see each other. Kept notes never expire and
are never trimmed; they are lost only with the store's memory (a Redis without
persistence that restarts, a deleted SQLite file). A store that cannot keep a note
without an end says so (:attr:`ClaimStore.keeps_notes` false) and its three calls raise
a :class:`~beatless.errors.ConfigError` that says why and names the stores that can
(:data:`KEEPING_STORES`). RabbitMQ is such a store: its notes live at most 24 hours.

**What the store remembers.** Whether a claim survives depends on settings of the server
as much as on this contract: a Redis that evicts keys when its memory is full forgets
claims (and a firing whose claim was evicted is sent again), one without persistence
forgets every claim when it restarts. :meth:`ClaimStore.facts` reads those settings and
judges each (:class:`Fact`, :class:`Verdict`): ``refuse`` for a setting under which the
store cannot keep this contract, ``warn`` for one that costs firings on a fault (and for
a setting that could not be read), ``ok``. :meth:`ClaimStore.watch` reads them and keeps
the refusal: a store whose settings are refused answers no claim (it raises
:class:`~beatless.errors.StoreRefused` naming the setting and the fix) until a later
``watch`` finds them fixed. Nodes call ``watch`` at start (a refusal stops the start),
every ten seconds, and at once after a write refused as full; in between, at every sync
of the registry (about once a second), ``watch(quick=True)`` reads again only
:meth:`ClaimStore.quick_facts`: the settings that can change under a running server and
make it lose claims while it still takes every write (Redis: the eviction policy), in
one cheap command. So such a setting, also on another server after a reconnection, is
noticed within a sync, and the rest within ten seconds.

**A full store.** A write the store refuses because it is full (Redis at ``maxmemory``
under ``noeviction``, PostgreSQL out of disk, a JetStream stream at its limit) raises
:class:`~beatless.errors.StoreFull`, having written nothing. A ``commit`` refused so may
still make its claims committed, without writing its notes, where the store can do that
without room (Redis: a commit script allowed to run out of memory): it then raises
``StoreFull`` with :attr:`~beatless.errors.StoreFull.kept` set, so that a claim whose
message was sent is not taken over as if its winner had died.

A record the store cannot read (a corrupt value, a newer format, another program's key)
fails only its own firing, with :attr:`Outcome.CORRUPT`; nothing is written for it.

Leases and memory are measured on the store's clock only, so skew between nodes cannot
make a live lease look expired. Both include their last millisecond: a claim granted at
``t`` for ``lease_ms`` is held through ``t + lease_ms`` and can be taken over from the
millisecond after, so a claim committed at the occurrence with ``memory_ms`` of exactly
``max_late + 10 s`` is still remembered at the last instant it could be claimed on time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Self

from beatless.errors import ConfigError, StoreRefused
from beatless.stores._claims import (
    NEVER_LATE_MS,
    OUTCOME_LETTERS,
    STORE_TOLERANCE,
    TAG_LENGTH,
    TOLERANCE_MS,
    ClaimRecord,
    ClaimRequest,
    Epoch,
    Held,
    Outcome,
    is_running,
    judge,
    judging,
)
from beatless.stores._facts import UNKNOWN, Fact, StoreFacts, Verdict
from beatless.stores._notes import (
    ITEM_TAIL_LIMIT,
    KEEPING_STORES,
    NOT_IN_NAMES,
    NOTE_NAME_LIMIT,
    NOTE_VALUE_LIMIT,
    KeptNote,
    Note,
    NoteItem,
    check_note,
)

# The contract's value types live in modules of their own, imported from here.
__all__ = [
    "ITEM_TAIL_LIMIT",
    "KEEPING_STORES",
    "NEVER_LATE_MS",
    "NOTE_NAME_LIMIT",
    "NOTE_VALUE_LIMIT",
    "NOT_IN_NAMES",
    "OUTCOME_LETTERS",
    "STORE_TOLERANCE",
    "TAG_LENGTH",
    "TOLERANCE_MS",
    "UNKNOWN",
    "ClaimRecord",
    "ClaimRequest",
    "ClaimStore",
    "Epoch",
    "Fact",
    "Held",
    "KeptNote",
    "Note",
    "NoteItem",
    "Outcome",
    "StoreFacts",
    "Verdict",
    "check_note",
    "is_running",
    "judge",
    "judging",
]


class ClaimStore(ABC):
    """Where nodes race for firings. See the module docstring for the contract."""

    name: str = "store"
    """A short name for messages: ``memory``, ``sqlite``, ``redis``."""

    @property
    def remembers(self) -> timedelta | None:
        """How long the store remembers a committed claim, or ``None`` when it keeps each
        claim for the ``memory_ms`` the claim asks for (lease stores). A store that forgets
        on a fixed window returns that window, and start-up refuses entries it cannot
        cover (rule 5)."""
        return None

    def lengthen_memory(self, needed: timedelta) -> str:
        """What to change so that the store remembers a claim longer than ``needed``:
        the end of rule 5's error, for a store whose :attr:`remembers` is too short."""
        return "lengthen the store's memory"

    epoch: Epoch | None = None
    """The epoch this store object last saw (``None`` before its first claim)."""

    _forgot_before_ms: int | None = None
    """The horizon of the last change of epoch this store object saw, until settled."""

    reseeds: bool = False
    """Whether the store implements :attr:`holds_off`, :meth:`reseed` and :meth:`settle`
    (see "Re-seeding" in the module docstring). Every store here does."""

    holds_off: bool = False
    """Whether a claim answers :attr:`Outcome.RESEEDING`, writing nothing, for a firing it
    would answer :attr:`Outcome.FORGOTTEN`: set by a node loop that re-seeds and settles
    (:mod:`beatless._reseed`); a store object without such a loop keeps it false."""

    @property
    def forgot_before_ms(self) -> int | None:
        """The horizon this store object still applies: absent firings released before it
        are forgotten (or held off); ``None`` when none."""
        return self._forgot_before_ms

    def reseed(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int
    ) -> list[Outcome]:
        """Write back firings this node sent before the store lost its memory: each is
        claimed as :meth:`claim` would without :attr:`holds_off` (absent and released
        before the horizon: written committed, :attr:`Outcome.FORGOTTEN`), and one won
        is committed at once, so no node sends any of them again. One outcome each."""
        outcomes = self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=False)
        won = [r.id for r, o in zip(requests, outcomes, strict=True) if o.is_won]
        if won:
            self.commit(won, node=node)
        return outcomes

    def claim_held_off(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int
    ) -> list[Outcome]:
        """:meth:`claim`, holding off whatever :attr:`holds_off` says: a request that
        would be :attr:`Outcome.FORGOTTEN` is :attr:`Outcome.RESEEDING`, and nothing is
        written. For a claim that must never be written committed without its winner, a
        live revision number (:mod:`beatless.live._ledger`); a store that does not re-seed
        claims as :meth:`claim` does."""
        if not self.reseeds:
            return self.claim(requests, node=node, lease_ms=lease_ms)
        return self._claim_judged(requests, node=node, lease_ms=lease_ms, hold_off=True)

    def _claim_judged(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int, hold_off: bool
    ) -> list[Outcome]:
        """:meth:`claim`, holding off or not whatever :attr:`holds_off` says: stores that
        re-seed implement it, and their :meth:`claim` calls it with :attr:`holds_off`."""
        raise NotImplementedError(f"the {self.name} store does not re-seed")

    def recheck_epoch(self) -> None:  # noqa: B027 - a store with one epoch record has nothing to do
        """Read the store's epoch again now, adopting a change with its horizon as a claim
        would: a node calls it before it writes back, since another node's note may name a
        change this store object has not met. Nothing here: a store with one epoch record
        meets every change at its next claim. Raises
        :class:`~beatless.errors.StoreError` when the store cannot be read."""

    def settle(self, epoch: Epoch) -> bool:
        """Drop the horizon of ``epoch`` (every node the fleet knew wrote back what it
        sent): later claims judge an absent firing as new. Nothing if this store object
        has since seen another epoch; whether the horizon was dropped."""
        if self.epoch is None or self.epoch.token != epoch.token:
            return False
        self._forgot_before_ms = None
        return True

    @abstractmethod
    def time_ms(self) -> int:
        """The store's clock now, in epoch milliseconds: one round trip (Redis ``TIME``).

        Stores with no clock of their own return the local clock. Nodes compare it with
        their own to measure their offset to the store. Raises
        :class:`~beatless.errors.StoreUnavailable` when the store cannot be reached.
        """

    @abstractmethod
    def probe(self) -> None:
        """Connect, authenticate, write, read back and delete a probe record under this
        store's namespace or prefix; raise a :class:`~beatless.errors.StoreError` (or
        :class:`~beatless.errors.StoreUnavailable`) whose message says what failed.

        ``beatless run`` and ``beatless check --store`` call it before anything else, so
        a wrong password or an unreachable server is one line at start, not a traceback
        at every wake.
        """

    def facts(self) -> StoreFacts:
        """The store's settings that decide whether a claim survives, each judged (see
        "What the store remembers" in the module docstring). Never raises for a store
        that cannot be reached or will not say: such a setting's value is
        :data:`UNKNOWN`, a warning. A store with nothing to read (memory, SQLite) has
        no facts, a verdict of ``ok``."""
        return StoreFacts(f"{self.name} store")

    refusal: str | None = None
    """Why claims are refused, as the last :meth:`watch` found (``None``: they are not)."""

    def quick_facts(self) -> StoreFacts | None:
        """The few settings that can change under a running server and make it lose claims
        while it still takes every write (Redis: ``maxmemory-policy`` and ``maxmemory``),
        read again in one cheap command, judged as :meth:`facts` judges them; ``None`` for
        a store that has none, or when they could not be read (the facts read last
        stand)."""
        return None

    watched: StoreFacts | None = None
    """The facts as the last :meth:`watch` read them."""

    def watch(self, *, quick: bool = False) -> StoreFacts:
        """Read :meth:`facts` and keep their refusal: while it holds, a claim raises
        :class:`~beatless.errors.StoreRefused` with it (:meth:`refuse_claims`). With
        ``quick``, read only :meth:`quick_facts`, over the facts the last ``watch`` read
        (all of them, the first time)."""
        last = self.watched
        if quick and last is not None:
            fresh = self.quick_facts()
            facts = last if fresh is None else last.updated(fresh)
        else:
            facts = self.facts()
        self.watched = facts
        self.refusal = facts.refusal()
        return facts

    def refuse_claims(self) -> None:
        """Raise :class:`~beatless.errors.StoreRefused` while the last :meth:`watch`
        refused the store's settings: every store calls it before it claims."""
        if self.refusal is not None:
            raise StoreRefused(f"claims stopped: {self.refusal}")

    commits_notes: bool = True
    """Whether :meth:`commit` writes its notes in the same operation as the claims (the
    history of a sent firing then exists exactly when its commit does)."""

    notes_live_ms: int | None = None
    """The longest ``ttl_ms`` a note may have on this store; ``None``: any."""

    checks_overlap: bool = True
    """Whether :meth:`claim` answers :attr:`Outcome.OVERLAP` (see the module docstring)."""

    holds_run_leases: bool = True
    """Whether a holder's renewal keeps its claim without a gap, so that a run lease
    (:mod:`beatless.node.runs`) excludes every other run while it is renewed. A store that
    would renew by giving the claim up and taking it again must say false: entries with
    ``overlap = "skip"`` are refused on it at start-up, and once-only checks on it have
    that window of one round trip per heartbeat. Every store here holds run leases."""

    checks_revisions: bool = False
    """Whether :meth:`claim` answers :attr:`Outcome.STALE` to a claim of an older live
    revision than one in force at its occurrence (see "Live revisions" in the module
    docstring); a store that does not leaves rule 6 to the nodes' propagation rule."""

    @abstractmethod
    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        """Claim each firing as pending for ``lease_ms``; one outcome per request, in order.

        The whole batch is one round trip where the store allows it. Raises
        :class:`~beatless.errors.StoreUnavailable` when the store cannot be reached; then
        no claim of the batch may be assumed won.
        """

    reads_claims: bool = False
    """Whether :meth:`claim_records` reads the claims (see "Claim records" in the module
    docstring); a store that cannot read one without disturbing it reads none."""

    def claim_records(self, ids: Sequence[str]) -> dict[str, ClaimRecord]:
        """The claim records the store holds for ``ids``, ``{id: record}``: an id without
        one (never claimed, forgotten, or unreadable) is left out. Reads only; one round
        trip where the store allows. Raises :class:`~beatless.errors.StoreUnavailable`
        when the store cannot be reached. This default, for a store that does not read
        claims (:attr:`reads_claims` false), finds none."""
        return {}

    @abstractmethod
    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        """Make this node's pending claims committed, remembered for their ``memory_ms``,
        and post ``notes`` (as :meth:`post` does, whatever the flags say) in the same
        operation: a transaction or a script where the store has one, so that a node that
        dies mid-call leaves both or neither. A store without one posts them right after
        the commit, in the same call (:attr:`commits_notes` false).

        Returns, per id, whether the claim was still this node's: ``False`` means its
        lease ran out and another node took it over. A store that is full raises
        :class:`~beatless.errors.StoreFull` (with ``kept`` when the claims were committed
        all the same, the notes not written).
        """

    @abstractmethod
    def release(self, ids: Sequence[str], *, node: str) -> None:
        """End this node's pending claims now (the enqueue failed, or was not attempted
        because the claim got too old or the firing late), so they can be claimed again.

        The record is kept with its lease ended, so the next claim that is not late wins
        it as :attr:`Outcome.TAKEOVER`; a committed claim, or another node's, is left
        alone."""

    @abstractmethod
    def post(self, notes: Sequence[Note]) -> None:
        """Write each note, replacing the note of the same kind and key, then bound the
        kinds of the notes with a ``keep``; one round trip where the store allows.

        Raises :class:`~beatless.errors.StoreUnavailable` when the store cannot be
        reached; then any of the notes may or may not have been written.
        """

    @abstractmethod
    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        """The live notes of each kind asked, ``{kind: {key: value}}``; a kind with none
        maps to ``{}``. One round trip where the store allows."""

    def read_logs(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        """The live notes of each kind asked, ``{kind: {key: value}}``, whether they were
        posted :attr:`~Note.logged` or in place (see "Logged notes" in the module
        docstring); one round trip where the store allows. This default, for a store
        that keeps no logs, is :meth:`read_notes`."""
        return self.read_notes(kinds)

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """:meth:`read_notes` of ``kinds`` and, for each kind of ``kept``, the kept notes
        of the keys it names (those that exist): what a node reads at its sync. One round
        trip on memory, SQLite, Redis and PostgreSQL; elsewhere (this default) one call of
        :meth:`read_notes` and one of :meth:`read_kept` per kept kind."""
        notes = self.read_notes(kinds) if kinds else {}
        return notes, {kind: self.read_kept(kind, keys) for kind, keys in kept.items()}

    def post_and_read(
        self, notes: Sequence[Note], kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """:meth:`post` ``notes`` (if any), then :meth:`read_synced`: a node's sync, in
        one round trip where the store can send both at once (Redis, for the notes a node
        posts every second; see :mod:`beatless.stores.redis._refresh`). Raises as
        :meth:`post` does, and then reads nothing."""
        if notes:
            self.post(notes)
        return self.read_synced(kinds, kept)

    keeps_notes: bool = False
    """Whether the store keeps notes until they are deleted (:meth:`keep_notes`); a store
    that cannot says why in :attr:`why_not_kept`."""

    why_not_kept: str = "it does not implement kept notes"

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        """Write each kept note, replacing the kept note of the same kind and key (the last
        one, if ``notes`` names one twice); one transaction and one round trip where the
        store allows. Raises :class:`~beatless.errors.StoreUnavailable` when the store
        cannot be reached: then any of the notes may or may not have been written."""
        raise self.cannot_keep()

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        """The kept notes of ``kind``, ``{key: value}``: all of them, or those of ``keys``
        that exist. One round trip where the store allows."""
        raise self.cannot_keep()

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        """Delete the kept notes of ``kind`` named by ``keys``; a key with none is no error."""
        raise self.cannot_keep()

    def cannot_keep(self) -> ConfigError:
        """The refusal of a store that does not keep notes until they are deleted."""
        return ConfigError(
            f"the {self.name} store cannot keep notes until they are deleted ({self.why_not_kept}),"
            f" so it cannot hold live entries; use one of: {', '.join(KEEPING_STORES)}"
        )

    def close(self) -> None:  # noqa: B027 - most stores have nothing to close
        """Close what the store opened itself; a client passed in is left open."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
