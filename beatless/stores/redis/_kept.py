"""Kept notes on Redis and Redis Cluster: one hash per kind, no expiry.

A kind of kept notes (:class:`~beatless.stores.base.KeptNote`) is a hash named by the
SHA-256 of the kind in hex (``{prefix}kept:{digest}`` on one Redis, ``{prefix}{kept:
{digest}}`` on a cluster, so the hash is in one slot): one field per note, its key,
whose value is ``v=1|{value}``. The hash has no time to live: a note is gone only when
it is deleted (``HDEL``) or Redis loses its data. A field in another form is not read.
Writes of several kinds go in one ``MULTI`` on one Redis, and in one pipeline, a kind
at a time, on a cluster.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from beatless.stores.base import KeptNote

KEPT_VERSION = 1
"""The layout of a kept note's field value; a value in another form is not read."""
_MARK = f"v={KEPT_VERSION}|"


def kept_digest(kind: str) -> str:
    """The name of ``kind``'s hash, after the prefix: the SHA-256 of the kind in hex."""
    return hashlib.sha256(kind.encode()).hexdigest()


def keep(pipe: Any, notes: Sequence[KeptNote], key_of: Callable[[str], str]) -> None:
    """Queue on ``pipe`` the writes of ``notes``, one ``HSET`` per kind."""
    by_kind: dict[str, dict[str, str]] = {}
    for note in notes:
        by_kind.setdefault(note.kind, {})[note.key] = _MARK + note.value
    for kind, fields in by_kind.items():
        pipe.hset(key_of(kind), mapping=fields)


def read(
    client: Any, kind: str, keys: Sequence[str] | None, key_of: Callable[[str], str]
) -> dict[str, str]:
    """The kept notes of ``kind``: all of them (``HGETALL``), or those of ``keys``
    (``HMGET``); one round trip."""
    name = key_of(kind)
    if keys is None:
        found = {_text(k): _text(v) for k, v in client.hgetall(name).items()}
    else:
        asked = list(dict.fromkeys(keys))
        values = client.hmget(name, asked) if asked else []
        found = {k: _text(v) for k, v in zip(asked, values, strict=True) if v is not None}
    return {k: v[len(_MARK) :] for k, v in found.items() if v.startswith(_MARK)}


def queue_read(pipe: Any, kind: str, keys: Sequence[str], key_of: Callable[[str], str]) -> None:
    """Queue on ``pipe`` the read of the kept notes of ``kind`` named by ``keys``
    (``HMGET``); :func:`read_reply` reads its reply."""
    pipe.hmget(key_of(kind), list(dict.fromkeys(keys)))


def read_reply(keys: Sequence[str], values: Sequence[Any]) -> dict[str, str]:
    """The kept notes in the reply of :func:`queue_read`."""
    asked = list(dict.fromkeys(keys))
    found = {k: _text(v) for k, v in zip(asked, values, strict=True) if v is not None}
    return {k: v[len(_MARK) :] for k, v in found.items() if v.startswith(_MARK)}


def field_value(value: Any) -> str | None:
    """A kept note's value from its hash field's (``None``: absent, or in another form)."""
    text = None if value is None else _text(value)
    return text[len(_MARK) :] if text is not None and text.startswith(_MARK) else None


def delete(client: Any, kind: str, keys: Sequence[str], key_of: Callable[[str], str]) -> None:
    """Delete the kept notes of ``kind`` named by ``keys`` (``HDEL``)."""
    if keys:
        client.hdel(key_of(kind), *dict.fromkeys(keys))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
