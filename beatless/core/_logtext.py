"""Names as they stand in a log message: escaped, so that none can forge a line, and short.

Entry names, tenants, addresses, node and task names come from a user's configuration or
from a tenants callable. Written into a log message as they are, a name holding a line
break makes the rest of it look like a line of its own (``\\n2026-12-01 00:00:00
CRITICAL ...``), and one holding an ANSI escape recolours or erases a terminal. Every
log message of the core writes such values through :func:`shown`.
"""

from __future__ import annotations

LIMIT = 200
"""Characters of a value kept in a log message; the rest is cut and counted."""
ERROR_LIMIT = 500
"""Characters of an error's text kept in a log message (it may quote a name or an
address, so it is shown like one)."""


def shown(value: object, *, quoted: bool = True, limit: int = LIMIT) -> str:
    """``value`` as it may stand in a log message, on one line and at most ``limit``
    characters (before escaping) long.

    A string is written as ``repr`` writes it: quoted, with every line break, carriage
    return, other control character, ANSI escape and invisible format character (such
    as a bidirectional override) as a backslash escape. ``quoted=False`` leaves the
    quotes off, for values logged bare (a node name, a task name, an error's text).
    ``None`` is ``None``; any other value is written as its ``str``.
    """
    if value is None:
        return "None"
    text = value if isinstance(value, str) else str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    if quoted:
        escaped = repr(text)
    elif text.isprintable() and "\\" not in text:
        escaped = text  # what _bare gives each of its characters, at once
    else:
        escaped = "".join(map(_bare, text))
    return f"{escaped}...({cut} more characters)" if cut > 0 else escaped


def _bare(char: str) -> str:
    """One character of an unquoted value: itself, or the escape ``repr`` gives it when it
    is not printable (or a backslash, so that an escape cannot be forged)."""
    return char if char.isprintable() and char != "\\" else repr(char)[1:-1]


class WarnEvery:
    """Which warnings may be logged now: each key at most once per its interval, so that
    a fault that repeats every wake is one line now and then, not a flood."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def allows(self, key: str, every_ms: int, now_ms: int) -> bool:
        """Whether ``key`` may be warned about at ``now_ms``; if so, it is counted as
        warned then. A clock that went back allows it at once."""
        last = self._last.get(key)
        if last is not None and 0 <= now_ms - last < every_ms:
            return False
        self._last[key] = now_ms
        return True
