"""Revisions: the numbered, immutable changes that make up a namespace's live entries.

The data model, which nodes and tools read:

* A **change** (:class:`Change`) puts one entry (its JSON, :mod:`beatless.live.codec`)
  or deletes one name (``entry`` is ``None``).
* A **revision** (:class:`Revision`) is a batch of changes with a number (1, 2, ... with
  no gap), a content hash (SHA-256 over each change's name and entry, args, kwargs and
  options included, written by :func:`beatless.schedule.entry.canonical`), the writer
  (a login name), its host, a note, the instant it was committed on the store's clock
  (``committed_ms``) and its **fence** (``fence_ms``): the instant, on the store's clock,
  from which it is in force. Fences never go back: a revision's fence is at least its
  predecessor's.
* The **state** at revision ``r`` (:func:`state`) is the fold of revisions 1 to ``r``:
  ``{name: entry JSON}``. The revision **in force** for an occurrence
  (:func:`in_force`) is the latest revision whose fence is at or before the occurrence
  (rule 1 of issue 24); an occurrence before every fence has no live entry (rule 2).

These functions are pure: the same revisions give the same answer on every node.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from beatless.errors import ConfigError
from beatless.schedule.entry import canonical

REVISION_VERSION = 1
"""The layout of a stored revision; another version is refused."""

State = Mapping[str, Mapping[str, Any]]
"""The live entries at one revision: each name's entry as JSON."""

_PLAIN_KEY = re.compile(r"[#-\[\]-~]*")
"""Keys that sort alike bare and as JSON text: printable ASCII after ``"``, no ``\\``."""
_MARKS = ("\\", " ", "!")
"""What the JSON text of a key that may sort apart quoted shows: an escape (``"``, ``\\``,
a control or non-ASCII character), a space or a ``!``."""


@dataclass(frozen=True, slots=True)
class Change:
    """One entry put (``entry`` its JSON) or one name deleted (``entry`` is ``None``)."""

    name: str
    entry: Mapping[str, Any] | None
    override: bool = False
    """Written over a name the code schedule owns, on purpose (``override=True``): nodes
    report it as drift until the code catches up."""

    @property
    def is_delete(self) -> bool:
        return self.entry is None

    def to_json(self) -> dict[str, Any]:
        data = {"name": self.name, "entry": None if self.entry is None else dict(self.entry)}
        return data | ({"override": True} if self.override else {})


@dataclass(frozen=True, slots=True)
class Revision:
    """One committed, immutable change of the live entries (see the module docstring)."""

    number: int
    changes: tuple[Change, ...]
    committed_ms: int
    fence_ms: int
    writer: str = ""
    host: str = ""
    note: str = ""
    hash: str = field(default="")

    def __post_init__(self) -> None:
        if not self.hash:
            object.__setattr__(self, "hash", content_hash(self.changes))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(change.name for change in self.changes)

    def meta_json(self) -> dict[str, Any]:
        """Everything but the changes, as stored."""
        return {
            "v": REVISION_VERSION,
            "number": self.number,
            "hash": self.hash,
            "committed_ms": self.committed_ms,
            "fence_ms": self.fence_ms,
            "writer": self.writer,
            "host": self.host,
            "note": self.note,
        }

    def to_json(self) -> dict[str, Any]:
        return self.meta_json() | {"changes": [c.to_json() for c in self.changes]}

    @classmethod
    def from_json(cls, data: Any) -> Revision:
        if not isinstance(data, dict) or data.get("v") != REVISION_VERSION:
            version = data.get("v") if isinstance(data, dict) else None
            raise ConfigError(
                f"stored revision has format {version!r}; this beatless reads format "
                f"{REVISION_VERSION}: upgrade beatless"
            )
        changes = tuple(
            Change(str(c["name"]), c.get("entry"), bool(c.get("override", False)))
            for c in data.get("changes", ())
        )
        revision = cls(
            number=int(data["number"]),
            changes=changes,
            committed_ms=int(data["committed_ms"]),
            fence_ms=int(data["fence_ms"]),
            writer=str(data.get("writer", "")),
            host=str(data.get("host", "")),
            note=str(data.get("note", "")),
        )
        if data.get("hash") != revision.hash:
            raise ConfigError(
                f"stored revision {revision.number}: its hash {data.get('hash')!r} is not that "
                f"of its changes ({revision.hash}): the record was altered"
            )
        return revision


def canonical_json(value: Any) -> str:
    """:func:`~beatless.schedule.entry.canonical` of ``value``, JSON as read or written by
    :mod:`beatless.live.codec` (object keys are text): the same text, written by the JSON
    encoder (in C) when the object keys sort alike bare and quoted, so that a node reading
    10,000 live entries hashes each in microseconds."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return canonical(value)
    if not any(mark in text for mark in _MARKS) or _plain(value):
        return text  # no key with a character that sorts apart quoted (its text shows it)
    return canonical(value)


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(
            type(key) is str and _PLAIN_KEY.fullmatch(key) and _plain(item)
            for key, item in value.items()
        )
    if isinstance(value, list | tuple):
        return all(_plain(item) for item in value)
    return value is None or type(value) in (str, int, float, bool)


def content_hash(changes: Iterable[Change]) -> str:
    """SHA-256 over each change's name and entry (args, kwargs, options included)."""
    text = canonical_json([c.to_json() for c in changes])
    return hashlib.sha256(text.encode()).hexdigest()


def state_hash(state: State) -> str:
    """SHA-256 of a state: equal on nodes whose live entries are equal."""
    text = canonical_json({k: dict(v) for k, v in state.items()})
    return hashlib.sha256(text.encode()).hexdigest()


def fold(
    base: State, changes: Iterable[Change], *, in_place: bool = False
) -> dict[str, Mapping[str, Any]]:
    """``base`` with ``changes`` applied in order: a copy, or ``base`` itself changed
    (``in_place``, for a dict)."""
    result = base if in_place and isinstance(base, dict) else dict(base)
    for change in changes:
        if change.entry is None:
            result.pop(change.name, None)
        else:
            result[change.name] = change.entry
    return result


def state(revisions: Sequence[Revision], at_revision: int | None = None) -> dict[str, Any]:
    """The live entries at ``at_revision`` (``None``: the last of ``revisions``): the fold
    of every revision numbered up to it, in number order."""
    chosen = sorted(
        (r for r in revisions if at_revision is None or r.number <= at_revision),
        key=lambda r: r.number,
    )
    result: dict[str, Any] = {}
    for revision in chosen:
        result = fold(result, revision.changes)
    return result


def in_force(revisions: Sequence[Revision], occurrence_ms: int) -> Revision | None:
    """The revision an occurrence runs under: the latest (highest number) whose fence is
    at or before ``occurrence_ms``; ``None`` when it is before every fence."""
    best: Revision | None = None
    for revision in revisions:
        if revision.fence_ms <= occurrence_ms and (best is None or revision.number > best.number):
            best = revision
    return best


def entry_in_force(revisions: Sequence[Revision], name: str, occurrence_ms: int) -> Any | None:
    """The JSON of entry ``name`` for an occurrence, by :func:`in_force`; ``None`` when the
    entry is not live then."""
    revision = in_force(revisions, occurrence_ms)
    return None if revision is None else state(revisions, revision.number).get(name)


def history(revisions: Sequence[Revision], name: str | None = None) -> list[Revision]:
    """The revisions that change ``name`` (every revision for ``None``), oldest first."""
    chosen = (r for r in revisions if name is None or name in r.names)
    return sorted(chosen, key=lambda r: r.number)


def diff(current: State, target: State) -> list[Change]:
    """The changes that make ``current`` equal to ``target`` (names in order)."""
    changes = [
        Change(name, target[name])
        for name in sorted(target)
        if name not in current or canonical_json(current[name]) != canonical_json(target[name])
    ]
    changes += [Change(name, None) for name in sorted(current) if name not in target]
    return changes
