"""Store URLs in messages: secrets never leave in a repr, a log line or an error.

The drivers do not agree on where a password ends. redis-py, nats-py and pika split the
URL with :func:`urllib.parse.urlsplit`, so an unencoded ``/``, ``?`` or ``#`` ends their
host part early and the rest of the password lands in a port, a path or a query; libpq
ends the user part at the first ``@`` or ``/``. None of these rules can be trusted to find
the password of a URL the driver itself cannot read, and that URL is exactly the one an
error message quotes. So the user part is found here by a rule that holds for every
driver and every password: it runs from the ``//`` after the scheme to the *last* ``@``
of the URL (no host name holds an ``@``), and the password is everything in it after its
first ``:``. Where that reaches into a path or a query (an ``@`` there), more is masked
than the password; never less.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

MASK = "***"

_QUERY_PASSWORD = re.compile(
    r"(?P<key>[?&][\w.\-]*password=)(?P<value>.*?)(?=&[A-Za-z_][\w.\-]*=|\Z)",
    re.IGNORECASE | re.DOTALL,
)
"""A ``password`` option in a query (``?password=``, ``&sentinel_password=``): its value
runs to the next ``&name=`` or the end of the URL, a ``#`` included, since a password
may hold one unencoded."""

_CUTS = re.compile(r"[/?#@:&;,\[\]\s]+")
"""What a driver's URL parser may cut a password at, quoting a piece of it as a port, a
host, a path or an option in its error."""

_PLAIN_PIECE = 4
"""Pieces of a password this long or longer are scrubbed wherever they stand."""

_TOKEN_SCHEMES = frozenset({"nats"})
"""Schemes whose user part, given with no password, is itself a secret (a NATS token)."""


def mask_url(url: str) -> str:
    """``url`` with its password, in the user part or the query, replaced by ``***``.

    Holds for any password, encoded or not: no character of it is shown.
    """
    spans = [(m.start("value"), m.end("value")) for m in _QUERY_PASSWORD.finditer(url)]
    start, at = _authority(url)
    if at is not None:
        colon = url.find(":", start, at)
        if colon >= 0:
            spans.append((colon + 1, at))
        elif at > start and _scheme(url) in _TOKEN_SCHEMES:
            spans.append((start, at))
    merged: list[list[int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    parts, shown = [], 0
    for begin, end in merged:
        parts += [url[shown:begin], MASK]
        shown = end
    return "".join(parts) + url[shown:]


def secrets_of(url: str) -> list[str]:
    """The passwords a URL carries, longest first, to scrub them from messages that
    quote a driver: each as written, percent-decoded and as ``urlsplit`` reads it, and
    the pieces of at least 4 characters a driver may quote after cutting it at a ``/``,
    ``?``, ``#``, ``@`` or ``:`` (as a port, a host, a socket path or an option)."""
    passwords = _passwords(url)
    pieces = [p for s in passwords for p in _CUTS.split(s) if len(p) >= _PLAIN_PIECE]
    return _longest_first([*passwords, *pieces])


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with no password of ``url`` in it, and
    no piece of one. A piece shorter than 4 characters is masked only where it stands as
    a word of its own, so that a short piece leaves the rest of the message readable."""
    for secret in secrets_of(url):
        text = text.replace(secret, MASK)
    pieces = {p for s in _passwords(url) for p in _CUTS.split(s) if p}
    for piece in _longest_first(pieces):
        text = re.sub(rf"(?<![^\W_]){re.escape(piece)}(?![^\W_])", MASK, text)
    return text


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    start, at = _authority(url)
    if at is not None:
        user, colon, password = url[start:at].partition(":")
        if colon:
            found.append(password)
        elif user and _scheme(url) in _TOKEN_SCHEMES:
            found.append(user)
    found += [m["value"] for m in _QUERY_PASSWORD.finditer(url)]
    try:
        seen_by_driver = urlsplit(url).password
    except ValueError:
        seen_by_driver = None
    found += [seen_by_driver] if seen_by_driver else []
    found += [unquote(secret) for secret in found]
    return _longest_first(found)


def _longest_first(texts: Iterable[str]) -> list[str]:
    return sorted({text for text in texts if text}, key=lambda t: (-len(t), t))


def ambiguous_user_part(url: str) -> bool:
    """Whether drivers may read ``url``'s user part differently: its last ``@`` stands
    after a ``/``, ``?`` or ``#`` (a password holding one unencoded, or an ``@`` in a
    path or a query), where ``urlsplit`` and libpq end the host part."""
    start, at = _authority(url)
    if at is None:
        return False
    return any(c in url[start:at] for c in "/?#")


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def _authority(url: str) -> tuple[int, int | None]:
    """Where the user part starts (after ``scheme://``, or at the start of a URL with
    none), and where it ends: the last ``@`` of the URL (``None``: no user part)."""
    sep = url.find("://")
    start = sep + 3 if sep >= 0 else 0
    at = url.rfind("@")
    return start, (at if at >= start else None)
