"""What the Redis stores write and send: the records, the Lua scripts and their arguments,
and the reading of their answers, shared by :class:`~beatless.stores.redis.store.RedisStore`
and :class:`~beatless.stores.redis.cluster.RedisClusterStore` (which puts each key in a
hash-tag bucket of its own; see its module).

Keys live under one prefix, ``beatless:{namespace}:`` unless ``prefix`` says otherwise,
so two apps on one Redis never collide:

``{prefix}claim:{firing id}``
    A string ``v=2|{state}|{acquired_until}|{memory_ms}|{tag}|{node}``: the format
    version, ``pending`` or ``committed``, the end of the lease or of the memory in epoch
    milliseconds on the server's clock, the memory the claim asked for, the task tag of
    the request (hex digits; see :attr:`~beatless.stores.base.ClaimRequest.tag`), and
    the node that holds it (last, so that a node name may contain ``|``). A version 1
    record, ``v=1|{state}|{acquired_until}|{memory_ms}|{node}`` (an earlier beatless),
    is read as one without a tag, so it is never foreign. A pending claim expires
    ``lease_ms + memory_ms`` after it was written, so a takeover can still be reported
    after its lease ran out; a committed claim is alive ``memory_ms`` after the commit
    (rule 5 holds by construction) and expires ``EXPIRY_SLACK_MS`` later. Redis forgets
    both on its own. ``release`` ends a pending claim's lease (``acquired_until`` =
    now - 1) and keeps the record, so the next claim is a takeover. A value in any other
    form (another version, another program's value or type) fails its own firing as
    ``corrupt`` and is never overwritten; so does a version 2 record for a beatless that
    reads version 1 only: upgrade every node of a namespace together.
    A claim that carries a live revision writes it after the node, as ``\x1f{revision}``
    (:mod:`beatless.stores._records`); a beatless that does not know it reads it as part
    of another node's name.
``{prefix}claim:{run id}``
    The run lease of an address (:func:`~beatless.schedule.firing.run_lease_id`): a claim record
    like any other, held pending by a worker while a run of the address is in progress
    (:mod:`beatless.node.runs`). A claim of a firing whose request names it
    (:attr:`~beatless.stores.base.ClaimRequest.run_id`) reads it in the same script and
    answers :attr:`~beatless.stores.base.Outcome.OVERLAP` while it is live and pending,
    writing the firing committed (its enqueue commands, on the atomic path, not run).
``{prefix}epoch``
    A string ``v=1|{started_ms}|{token}`` written (``SET NX``, no expiry) by the first
    claim that finds it absent: the store's identity. A Redis that lost its data (a
    restart without persistence, a flush) has none, so the next claim writes a new one
    and every store object that saw the old one notices.
``{prefix}probe:{random}``
    Written, read back and deleted by :meth:`RedisStore.probe`; expires in 10 s if a
    probe dies half-way.
``{prefix}notes:{digest}``
    A hash per kind of notes (:class:`~beatless.stores.base.Note`), named by the SHA-256
    of the kind in hex, since a kind is any text up to 1000 characters: one field per
    note, the note's key, whose value is ``v=1|{expires_ms}|{value}``. A note posted at
    ``t`` on the server's clock with ``ttl_ms`` expires at ``t + ttl_ms`` and is read
    through that millisecond; a read is ``TIME`` and then one ``HGETALL`` per kind in one
    pipeline (not a ``MULTI``, which a full Redis refuses), and drops the notes that
    expired by that ``TIME`` (and any field in another form).
``{prefix}log:{digest}``
    A stream per kind of logged notes (an address's history): see
    :mod:`beatless.stores.redis._logs`.
``{prefix}kept:{digest}``
    A hash per kind of kept notes (:class:`~beatless.stores.base.KeptNote`), with no
    expiry: see :mod:`beatless.stores.redis._kept`.
``{prefix}notes-expiry:{digest}``
    A sorted set beside each notes hash, the note's key scored by its ``expires_ms``: the
    index with which a script that writes notes (``notes.lua``: a post, a commit, a
    ``claim_and_push``) removes the kind's expired notes and, for a note with ``keep``,
    all but the ``keep`` that expire last, without reading the kind's values. Each
    write sets both keys to expire ``EXPIRY_SLACK_MS`` after the kind's last note, so a
    kind nobody posts to disappears on its own. A note costs its key twice (field and
    member), its value, about 25 bytes of record and score, and Redis's bookkeeping:
    about 20 bytes while its kind has at most 128 notes whose keys and field values fit
    in 64 bytes (Redis's compact encodings), about 150 beyond.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, TypeVar

from beatless.core._logtext import shown
from beatless.errors import ConfigError, StoreError
from beatless.stores._epoch import NEW
from beatless.stores._fences import live_checks
from beatless.stores._records import split_revision
from beatless.stores.base import (
    ITEM_TAIL_LIMIT,
    NOTE_VALUE_LIMIT,
    ClaimRecord,
    ClaimRequest,
    Epoch,
    Note,
    NoteItem,
)
from beatless.stores.redis._logs import Logs

logger = logging.getLogger("beatless.stores.redis.store")
"""The store's logger, as before this module was split from it."""


FORMAT_VERSION = 2
"""The layout of a claim record written now. Version 1 records (no task tag) are read
too; a claim whose record has any other version is refused as
:attr:`~beatless.stores.base.Outcome.CORRUPT`. The epoch record is ``v=2`` on its own."""
READ_VERSIONS = ("v=1", f"v={FORMAT_VERSION}")
NOTE_VERSION = 1
"""The layout of a note's field value, ``v=1|{expires_ms}|{value}``; a field in any other
form is never read."""

PROBE_TTL_MS = 10_000
"""How long a probe key may outlive a probe that died between writing and deleting it."""


EXPIRY_SLACK_MS = 1_000
"""How long Redis keeps a committed record past its ``acquired_until``, and a kind of notes
past its last note's expiry. Whether a claim or a note is alive is decided by comparing
its end with ``TIME``; the slack keeps Redis's own expiry, on a clock read at a slightly
different instant, from dropping the record before its last millisecond."""

NOTING_LIFE_MS = 3_600_000
"""How long the letters a claim script leaves for its notes script are kept: that script
runs right after it, in the same pipeline, and deletes them. Long, so that a Redis that
evicts the keys nearest their expiry first (``volatile-ttl``) takes them last."""

CHUNK = 1_000
"""Firings per script. A larger batch is sent as several scripts pipelined in one round
trip, so that no single script holds Redis (often the broker as well) for long."""

READ_KINDS = 256
"""Kinds of notes read per round trip (``read_notes``, ``read_logs``). The server holds a
pipeline's replies until the client reads them, and they count in its memory: the reads
of a status of 100,000 entries in one pipeline, with their histories full, would have
the server hold about 1.4 GB of replies at once (284 MB for 20,000 histories of fifty
200-byte items), enough to make a Redis at its ``maxmemory`` evict or refuse claims. A
kind's history is at most a few tens of KB: this many at a time, a few MB."""
READ_PAGE = 1_000
"""Fields of a kind's hash read per ``HSCAN`` call (1 to 2 ms of the server's time for
notes of 300 bytes): a bigger hash is read a page at a time."""


SCRIPTS = "lua"
"""The package folder of the scripts: ``prelude.lua`` is loaded in front of each of
``claim.lua``, ``commit.lua`` and ``release.lua``, which read claim records, and
``notes.lua`` in front of ``claim_notes.lua``, ``commit.lua`` and ``post.lua``, which
write notes. Each script's header gives its keys and ARGV."""


@dataclass(frozen=True, slots=True)
class Pushed:
    """Commands that enqueue one message, checked ahead of the claim and laid out as
    ``claim.lua`` takes them: ``counts``, each command's argument count joined by ``|``,
    and ``args``, every command's arguments in order. The script receives the arguments
    as arguments of its own (after all others) and runs each command with
    ``unpack(ARGV, first, last)``: nothing to split or copy on the server."""

    counts: str
    args: tuple[str, ...]


def pushed_commands(commands: Sequence[Sequence[str]] | str) -> Pushed:
    """``commands`` (``[["LPUSH", key, payload], ...]``, or that list as JSON text) as
    :class:`Pushed`: what ``claim.lua`` runs cheapest. Each command needs its name, and
    every argument is text."""
    if isinstance(commands, str):
        commands = json.loads(commands)
    counts: list[str] = []
    args: list[str] = []
    for command in commands:
        if not command:
            raise ValueError("claim_and_push: a command needs at least its name")
        for arg in command:
            if not isinstance(arg, str):
                raise TypeError(
                    f"claim_and_push: command arguments are text, got {type(arg).__name__}"
                )
        counts.append(str(len(command)))
        args += command
    return Pushed("|".join(counts), tuple(args))


def push_args(pushes: Sequence[Pushed], first: int) -> tuple[list[str], list[str]]:
    """Each of ``pushes`` as ``claim.lua`` names it, ``{first}|{counts}`` (``first`` the
    index in the script's ARGV of its first argument), and their arguments, laid from
    ARGV index ``first`` on."""
    heads: list[str] = []
    args: list[str] = []
    for pushed in pushes:
        heads.append(f"{first + len(args)}|{pushed.counts}")
        args += pushed.args
    return heads, args


def script(*names: str) -> str:
    folder = resources.files("beatless.stores.redis") / SCRIPTS
    return "".join((folder / name).read_text("utf-8") for name in names)


CLAIM = script("prelude.lua", "claim.lua")
EPOCHS = script("epochs.lua")
COMMIT = script("prelude.lua", "notes.lua", "commit.lua")
CLAIM_NOTES = script("notes.lua", "claim_notes.lua")
CLAIM_NOTES_ANYWAY = "#!lua flags=allow-oom\n" + CLAIM_NOTES
"""The notes of a claim script, allowed to write when Redis is out of memory (Redis 7
and later), as the claim script itself could once it had written its first claim: the
firings it sent must not be missing from their history."""
COMMIT_WITHOUT_ROOM = "#!lua flags=allow-oom\n" + COMMIT
"""The commit script, allowed to write when Redis is out of memory (Redis 7 and later):
run without notes when a commit is refused as full, it turns pending claims into
committed ones in place, growing no key by more than a few bytes."""
RELEASE = script("prelude.lua", "release.lua")
POST = script("notes.lua", "post.lua")


def commit_without_room(
    store: str,
    count: int,
    errors: Callable[[str], AbstractContextManager[None]],
    commit: Callable[[], list[bool]],
) -> list[bool] | None:
    """What ``commit`` returns: it runs the commit script flagged ``allow-oom``
    (``COMMIT_WITHOUT_ROOM``) on the ``count`` claims of a commit refused as full, within
    the store's ``errors``. ``None`` when that fails too (Redis before 7 has no such
    flag): said at WARNING; the claims stay pending, and while Redis refuses writes no
    other node can take them over."""
    try:
        with errors("commit without room"):
            return commit()
    except StoreError as exc:
        logger.warning(
            "%s: %d sent firing(s) left pending (%s); while Redis refuses writes no other "
            "node can take them over",
            shown(store, quoted=False),
            count,
            exc,
        )
        return None


def note_args(
    notes: Sequence[Note], logs: Logs, extends: list[tuple[str, float]]
) -> tuple[list[str], list[str | int]]:
    """The keys of the kinds of ``notes`` (as ``logs`` names them: a hash and its expiry
    index, or a log), and the notes as ``post.lua`` and ``commit.lua`` take them: per
    kind, its layout, its keep, its count and its notes. The logs extended are added to
    ``extends``."""
    by_kind: dict[tuple[str, bool], list[Note]] = {}
    for note in notes:
        by_kind.setdefault((note.kind, note.logged), []).append(note)
    keys: list[str] = []
    args: list[str | int] = []
    for (kind, _logged), posted in by_kind.items():
        kind_keys, layout = logs.layout(kind, posted, extends)
        keys += kind_keys
        # The kind's bound is the last one its notes ask for.
        keep = next((note.keep for note in reversed(posted) if note.keep), 0)
        args += [layout, keep, len(posted)]
        for note in posted:
            args += [note.key, note.ttl_ms, note.value]
    return keys, args


def claim_arg(request: ClaimRequest, run: int, live: str = "") -> str:
    """Request ``request`` as the claim script reads it; ``run`` numbers its run-lease
    key among the script's keys (``0``: none), ``live`` names its live check
    (``{l}:{field}``; empty: none)."""
    r = request
    if r.memory_ms <= 0 or r.max_late_ms < 0:
        raise ConfigError(
            f"redis store: firing {r.id} ({r.address!r}): memory_ms must be positive and "
            f"max_late_ms not negative, got {r.memory_ms} and {r.max_late_ms}"
        )
    numbers = f"{r.occurrence_ms}|{r.max_late_ms}|{r.memory_ms}|{r.release_ms}"
    revision = "" if r.revision is None else r.revision
    return f"{numbers}|{r.tag}|{run}|{live}|{revision}|{r.address}"


def claim_args(
    chunk: Sequence[ClaimRequest], runs: dict[str, int], kept_key: Callable[[str], str]
) -> tuple[list[str], list[str | int]]:
    """The live revision hashes that ``claim.lua`` reads for ``chunk``, to put after its
    run-lease keys, and its ARGV from the count on: ``n`` (``{n}|{L}`` with live hashes),
    then each request (``runs`` numbers the run-lease keys; ``kept_key`` names the hash
    of a kind of kept notes). A request's live check is ``{l}:{field}``: the field of
    the revision after its own (:func:`~beatless.stores._fences.live_checks`)."""
    notes, numbers = live_checks(chunk)
    hashes = list(dict.fromkeys(kept_key(kind) for kind, _ in notes))
    place = {key: number for number, key in enumerate(hashes, 1)}
    named = ["", *(f"{place[kept_key(kind)]}:{field}" for kind, field in notes)]
    args: list[str | int] = [f"{len(chunk)}|{len(hashes)}" if hashes else len(chunk)]
    for request, number in zip(chunk, numbers, strict=True):
        args.append(claim_arg(request, runs.get(request.run_id, 0), named[number]))
    return hashes, args


def parse_epoch(record: str) -> Epoch | None:
    """``v=2|{started_ms}|{token}|{replid}|{cause}`` (or an earlier ``v=1|{started_ms}|
    {token}``) as an :class:`Epoch` (``None`` when there is none)."""
    parts = record.split("|", 2)
    if len(parts) != 3 or not parts[0].startswith("v=") or not parts[1].isdigit():
        return None
    token = parts[2] if parts[0] == "v=1" else parts[2].split("|", 1)[0]
    return Epoch(token, int(parts[1]))


def epoch_cause(record: str) -> str:
    """What began the epoch of a record: ``failover`` (a promoted replica), ``evicted`` (a
    node found an evicting policy) or ``new``."""
    parts = record.split("|")
    return parts[4] if len(parts) == 5 and parts[0] != "v=1" else NEW


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_pages(
    pipeline: Callable[[], Any],
    hash_key: Callable[[str], str],
    fields: dict[str, dict[Any, Any]],
    cursors: dict[str, int],
) -> None:
    """Read into ``fields`` the pages that follow of each kind's hash whose first page
    left a cursor in ``cursors``: one pipeline (from ``pipeline()``) per page for all the
    kinds that have one, each page an ``HSCAN`` of ``READ_PAGE`` fields."""
    while cursors:
        pipe = pipeline()
        for kind, cursor in cursors.items():
            pipe.hscan(hash_key(kind), cursor, count=READ_PAGE)
        for kind, (cursor, page) in zip(list(cursors), pipe.execute(), strict=True):
            fields[kind].update(page)
            cursors[kind] = cursor
        cursors = {kind: cursor for kind, cursor in cursors.items() if cursor}


def live_notes(fields: dict[Any, Any], now_ms: int) -> dict[str, str]:
    """The notes of one kind's hash that are live at ``now_ms``, ``{key: value}``."""
    return {key: value for key, (_, value) in live_records(fields, now_ms).items()}


def live_records(fields: dict[Any, Any], now_ms: int) -> dict[str, tuple[int, str]]:
    """The notes of one kind's hash that are live at ``now_ms``, with when each
    expires: ``{key: (expires_ms, value)}``."""
    live = {}
    for key, record in fields.items():
        version, _, rest = as_text(record).partition("|")
        expires_ms, bar, value = rest.partition("|")
        readable = version == f"v={NOTE_VERSION}" and bar and expires_ms.isdigit()
        if readable and int(expires_ms) >= now_ms:
            live[as_text(key)] = (int(expires_ms), value)
    return live


def claim_record(record: Any) -> ClaimRecord | None:
    """A claim record (``v=2|{state}|{until_ms}|{memory_ms}|{tag}|{node}``, or ``v=1``
    without the tag) as :meth:`~beatless.stores.base.ClaimStore.claim_records` reads it;
    ``None`` for none, or one this version cannot read."""
    if record is None:
        return None
    parts = as_text(record).split("|", 5)
    if parts[0] == "v=1":
        parts.insert(4, "")
    if len(parts) != 6 or parts[0] not in READ_VERSIONS or not parts[2].isdigit():
        return None
    if parts[1] not in ("pending", "committed"):
        return None
    node, revision = split_revision(parts[5])
    return ClaimRecord(node, parts[1] == "committed", int(parts[2]), revision)


def claim_note_args(
    notes: Sequence[Note | NoteItem | None],
    requests: Sequence[ClaimRequest],
    logs: Logs,
    extends: list[tuple[str, float]],
) -> tuple[list[str], list[str | int]]:
    """The keys and the ARGV (after the version and the slack) that ``claim_notes.lua``
    takes for one note (or none) per request of a claim script: the distinct kinds' keys
    (as ``logs`` names them: a hash and its expiry index, or a log), numbered from 1, and
    their layouts; per request its note and its release, or its item's batch number
    (``@g``), its release and its firing's id; then the batch notes. A batch takes items
    while the note they would make, every item closed at its longest, stays within
    ``NOTE_VALUE_LIMIT``; the next item opens another batch of the same template. The
    logs extended are added to ``extends``."""
    templates = [n.batch if isinstance(n, NoteItem) else n for n in notes if n is not None]
    by_kind: dict[tuple[str, bool], list[Note]] = {}
    for template in templates:
        by_kind.setdefault((template.kind, template.logged), []).append(template)
    numbers = {kind: k for k, kind in enumerate(by_kind, 1)}
    keys: list[str] = []
    layouts: list[str | int] = []
    for (kind, _logged), posted in by_kind.items():
        kind_keys, layout = logs.layout(kind, posted, extends)
        keys += kind_keys
        layouts.append(layout)
    args: list[str | int] = [len(notes), len(by_kind), *layouts]
    batches: list[Note] = []
    open_: dict[Note, tuple[int, int]] = {}
    """The batch each template fills now, by number, and its longest size so far."""
    for note, request in zip(notes, requests, strict=True):
        if note is None:
            args += ["", "", ""]
        elif isinstance(note, NoteItem):
            size = len(note.item.encode()) + ITEM_TAIL_LIMIT + 1
            number, used = open_.get(note.batch, (0, 0))
            if not number or used + size > NOTE_VALUE_LIMIT:
                batches.append(note.batch)
                number, used = len(batches), len(note.batch.value.encode()) + 20
            open_[note.batch] = (number, used + size)
            args += [f"@{number}|{request.release_ms}", request.id, note.item]
        else:
            number = numbers[(note.kind, note.logged)]
            head = f"{number}|{note.ttl_ms}|{note.keep}|{request.release_ms}"
            args += [head, note.key, note.value]
    args.append(len(batches))
    for batch in batches:
        number = numbers[(batch.kind, batch.logged)]
        args += [f"{number}|{batch.ttl_ms}|{batch.keep}", batch.key, batch.value]
    return keys, args


M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Ready(Generic[M]):
    """What :meth:`RedisStore.claim_and_push` needs of one firing, built ahead of its
    release or when due: its claim, the commands that enqueue its ``message`` (:class:`Pushed`),
    and its history note."""

    message: M
    request: ClaimRequest
    commands: Pushed
    note: Note | NoteItem | None
