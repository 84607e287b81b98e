"""The kept notes of the PostgreSQL store (table ``kept_notes``, function ``keep_v1``):
notes with no end, replaced or deleted only, such as live entries and their revisions."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from beatless.stores.base import KeptNote

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

T = TypeVar("T")


def digest(name: str) -> bytes:
    """The key of a note's kind or key in the ``notes`` and ``kept_notes`` tables:
    SHA-256 of its UTF-8."""
    return hashlib.sha256(name.encode()).digest()


class KeptNotes:
    """The part of :class:`~beatless.stores.postgres.store.PostgresStore` that writes,
    reads and deletes kept notes."""

    namespace: str
    _statements: Any

    if TYPE_CHECKING:  # the store's own, which these methods call

        def _call(self, what: str, fn: Callable[[psycopg.Connection[Any]], T]) -> T: ...

        def _now_ms(self) -> int | None: ...

        def _row(
            self, what: str, query: sql.Composed | sql.SQL, args: Sequence[Any]
        ) -> tuple[Any, ...]: ...

    def read_synced(
        self, kinds: Sequence[str], kept: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """One query: the ``notes`` of ``kinds`` and the ``kept_notes`` asked, by primary
        key, in a ``UNION ALL``."""
        notes: dict[str, dict[str, str]] = {kind: {} for kind in kinds}
        found: dict[str, dict[str, str]] = {kind: {} for kind in kept}
        by_id = {digest(kind): kind for kind in notes}
        kept_ids = {digest(kind): kind for kind in found}
        pairs = [(digest(kind), digest(key)) for kind, keys in kept.items() for key in keys]
        args = (
            self.namespace,
            list(by_id),
            self._now_ms(),
            [kind for kind, _ in pairs],
            [key for _, key in pairs],
            self.namespace,
        )
        query = self._statements.read_synced
        rows = self._call("read notes", lambda conn: conn.execute(query, args).fetchall())
        for is_kept, kind_id, key, value in rows:
            if is_kept:
                found[kept_ids[bytes(kind_id)]][key] = bytes(value).decode()
            else:
                notes[by_id[bytes(kind_id)]][key] = bytes(value).decode()
        return notes, found

    keeps_notes = True

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        """One call of ``keep_v1``: one round trip and one transaction."""
        if not notes:
            return
        args = (
            self.namespace,
            [digest(n.kind) for n in notes],
            [digest(n.key) for n in notes],
            [n.kind for n in notes],
            [n.key for n in notes],
            [n.value.encode() for n in notes],
        )
        self._row("keep notes", self._statements.keep, args)

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        """One query of the ``kept_notes`` table, by primary key."""
        query: sql.Composed
        args: tuple[Any, ...] = (self.namespace, digest(kind))
        if keys is None:
            query = self._statements.read_kept
        else:
            query = self._statements.read_kept_keys
            args += ([digest(key) for key in keys],)
        rows = self._call("read kept notes", lambda conn: conn.execute(query, args).fetchall())
        return {key: bytes(value).decode() for key, value in rows}

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        if not keys:
            return
        args = (self.namespace, digest(kind), [digest(key) for key in keys])
        query = self._statements.delete_kept
        self._call("delete kept notes", lambda conn: conn.execute(query, args))
