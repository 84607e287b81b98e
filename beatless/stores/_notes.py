"""The values of notes and kept notes, and the limits of their names and values. See
"Notes" and "Kept notes" in :mod:`beatless.stores.base`, which re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass

from beatless.errors import ConfigError

NOTE_NAME_LIMIT = 1_000
"""The longest kind or key of a note, in characters."""
NOTE_VALUE_LIMIT = 16_384
"""The longest value of a note, in bytes of UTF-8."""
NOT_IN_NAMES = "\x00"
"""The character no name may hold (a namespace, an entry, a tenant, a note's kind or
key): note kinds and keys refuse it, and PostgreSQL text cannot hold it."""

# These limits bound a schedule's names: an address ``namespace/entry[/tenant]`` names its
# history note, and every entry has a note of what the fleet shows of it. The rules that
# follow from them are checked before a node starts (:func:`beatless.fleet.limits.limits`),
# so that no note is refused once a firing has been sent.


@dataclass(frozen=True, slots=True)
class Note:
    """A small record beside the claims (see "Notes" in :mod:`beatless.stores.base`)."""

    kind: str
    key: str
    value: str
    ttl_ms: int
    """How long the note lives from its post, on the store's clock."""
    keep: int = 0
    """After the post, keep only this many notes of the kind, those that expire last;
    ``0`` bounds nothing."""
    logged: bool = False
    """The note belongs to a log: a kind bounded by ``keep``, each key posted about once,
    in about the order its notes expire (an address's history). A store may append it to
    the kind's log rather than write it in place; read it with
    :meth:`~beatless.stores.base.ClaimStore.read_logs` (see "Logged notes" in
    :mod:`beatless.stores.base`)."""

    def __post_init__(self) -> None:
        check_note(self.kind, self.key, self.value)
        if self.ttl_ms <= 0 or self.keep < 0 or (self.logged and not self.keep):
            raise ConfigError(
                f"note {self.kind}/{self.key}: ttl_ms must be positive and keep at least 0 "
                f"(at least 1 for a logged note), got ttl_ms={self.ttl_ms} keep={self.keep}"
            )


def check_note(kind: str, key: str, value: str) -> None:
    """Refuse a note's kind, key or value beyond the limits of notes (kept or not)."""
    for part, text in (("kind", kind), ("key", key)):
        if not text or len(text) > NOTE_NAME_LIMIT or NOT_IN_NAMES in text:
            raise ConfigError(
                f"note {part} {text[:80]!r}: must be 1 to {NOTE_NAME_LIMIT} characters, without NUL"
            )
    if len(value.encode()) > NOTE_VALUE_LIMIT:
        raise ConfigError(
            f"note {kind}/{key}: value of {len(value.encode())} bytes is over {NOTE_VALUE_LIMIT}"
        )


@dataclass(frozen=True, slots=True)
class KeptNote:
    """A note kept until it is replaced or deleted (see "Kept notes" in
    :mod:`beatless.stores.base`): no time to live, no bound on its kind."""

    kind: str
    key: str
    value: str

    def __post_init__(self) -> None:
        check_note(self.kind, self.key, self.value)


KEEPING_STORES = ("memory", "sqlite", "redis", "redis-cluster", "postgres", "nats")
"""The stores that keep notes until they are deleted
(:attr:`~beatless.stores.base.ClaimStore.keeps_notes`)."""


@dataclass(frozen=True, slots=True)
class NoteItem:
    """One firing's item in a *batch note*: a note that a claim script writes once for
    many firings (:meth:`beatless.stores.redis.store.RedisStore.claim_and_push`).

    ``batch`` is the note's template. Its key is the prefix of the key written: the
    script adds ``.`` and the id of the first firing it notes, so two scripts never write
    the same key. Its value holds ``{{items}}`` where the items go, comma-separated, and
    ``{{at_ms}}`` for the script's ``TIME`` in epoch milliseconds. ``item`` is the start
    of this firing's item, a JSON array left open (``["tenant"``): the script closes it
    with ``,"{outcome}",{lateness_ms}]``. A store splits a batch into several notes so
    that each stays within ``NOTE_VALUE_LIMIT``."""

    batch: Note
    item: str


ITEM_TAIL_LIMIT = len(',"skipped_overlap",-99999999999999]')
"""The most a claim script adds to a :class:`NoteItem`'s ``item``."""
