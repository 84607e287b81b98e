"""Durations at the edges: seconds, ``"90s"``, ``"2m"``, ``"1h30m"`` and ISO 8601 ``"PT120S"``.

Inside beatless every duration is a :class:`~datetime.timedelta`; these helpers turn what
users write into one, and into the integer milliseconds the hot path uses.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from functools import lru_cache

from beatless.errors import ConfigError

DurationLike = timedelta | int | float | str

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_COMPACT = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_ISO = re.compile(
    r"P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)


def as_timedelta(value: DurationLike, *, name: str = "duration") -> timedelta:
    """Convert seconds, a compact string or an ISO 8601 duration into a timedelta.

    >>> as_timedelta("1h30m")
    datetime.timedelta(seconds=5400)
    >>> as_timedelta("PT120S")
    datetime.timedelta(seconds=120)
    """
    if isinstance(value, timedelta):
        return value
    try:
        return _convert(value, name)
    except OverflowError:
        raise ConfigError(f"{name}: duration {value!r} is too long") from None


def _convert(value: DurationLike, name: str) -> timedelta:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ConfigError(f"{name}: expected a finite number of seconds, got {value!r}")
        return timedelta(seconds=value)
    if isinstance(value, str):
        delta = _text_delta(value.strip())
        return timedelta(milliseconds=_parse_ms(value.strip(), name)) if delta is None else delta
    raise ConfigError(f"{name}: expected a duration, got {type(value).__name__} {value!r}")


def _parse_ms(text: str, name: str) -> float:
    if not text:
        raise ConfigError(f"{name}: empty duration")
    ms = _text_ms(text)
    if ms is not None:
        return ms
    raise ConfigError(
        f"{name}: cannot read duration {text!r}; write seconds (90), a compact form "
        f"('90s', '2m', '1h30m', '500ms') or ISO 8601 ('PT120S')"
    )


@lru_cache(maxsize=1024)
def _text_delta(text: str) -> timedelta | None:
    """The duration a text says, or None when it cannot be read (or is empty). Kept: a
    schedule writes the same few durations for many entries."""
    ms = _text_ms(text) if text else None
    return None if ms is None else timedelta(milliseconds=ms)


def _text_ms(text: str) -> float | None:
    """The milliseconds a duration's text says, or None when it cannot be read."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return seconds * 1_000
    upper = text.upper()
    if upper.startswith("P"):
        match = _ISO.fullmatch(upper)
        if match and upper not in ("P", "PT") and not upper.endswith("T"):
            parts = {k: float(v) for k, v in match.groupdict().items() if v}
            return sum(parts[k] * _UNITS_MS[k.lower()] for k in parts)
    else:
        lower = text.lower().replace(" ", "")
        pieces = _COMPACT.findall(lower)
        if pieces and "".join(n + u for n, u in pieces) == lower:
            return sum(float(n) * _UNITS_MS[u] for n, u in pieces)
    return None


def to_ms(delta: timedelta) -> int:
    """Whole milliseconds in ``delta`` (rounded down)."""
    return (delta.days * 86_400 + delta.seconds) * 1_000 + delta.microseconds // 1_000


@lru_cache(maxsize=1024)
def describe(delta: timedelta) -> str:
    """A short human form for messages: ``"90s"``, ``"2m"``, ``"1h30m"``, ``"250ms"``."""
    ms = to_ms(delta)
    if ms == 0:
        return "0s"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    out = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms >= size:
            count, ms = divmod(ms, size)
            out.append(f"{count}{unit}")
    if ms:
        out.append(f"{ms}ms")
    return sign + "".join(out)
