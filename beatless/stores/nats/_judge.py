"""The claims of the NATS store: the value of a claim key, and the decisions on it.

A claim's value is ``v=1|{state}|{until_ms}|{memory_ms}|{tag}|{node}`` (see
:mod:`beatless.stores.nats.store`), the live revision the claim carried after the node
(:mod:`beatless.stores._records`). :class:`_Decision` decides a claim with
:func:`~beatless.stores.base.judge`, on the server's clock a call read
(:class:`_State`); :class:`_Settle` decides a commit or a release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from beatless.errors import ConfigError
from beatless.stores._records import split_revision, with_revision
from beatless.stores.base import ClaimRecord, ClaimRequest, Epoch, Outcome, judge
from beatless.stores.nats._jetstream import WRONG_LAST_SEQUENCE, JetStreamError

FORMAT_VERSION = 1
"""The layout of a claim value; a value of any other version is ``CORRUPT``."""
_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]{0,16}")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(slots=True)
class _Record:
    node: str
    committed: bool
    until_ms: int
    memory_ms: int
    tag: str
    revision: int | None = None

    def encode(self) -> bytes:
        state = "committed" if self.committed else "pending"
        node = with_revision(self.node, self.revision)
        fields = (f"v={FORMAT_VERSION}", state, self.until_ms, self.memory_ms, self.tag, node)
        return "|".join(map(str, fields)).encode()

    def as_record(self) -> ClaimRecord:
        return ClaimRecord(self.node, self.committed, self.until_ms, self.revision)


class _Unreadable:
    """A value this version cannot read: its firing is refused as ``CORRUPT``."""


_UNREADABLE = _Unreadable()


def _decode(value: bytes | None) -> _Record | _Unreadable | None:
    if value is None:
        return None
    try:
        version, state, until, memory, tag, node = value.decode().split("|", 5)
    except ValueError:  # not UTF-8, or too few fields
        return _UNREADABLE
    valid = version == f"v={FORMAT_VERSION}" and state in ("pending", "committed")
    numbers = _DIGITS.fullmatch(until) and _DIGITS.fullmatch(memory)
    if not (valid and numbers and _HEX.fullmatch(tag)):
        return _UNREADABLE
    name, revision = split_revision(node)
    return _Record(name, state == "committed", int(until), int(memory), tag, revision)


@dataclass(frozen=True, slots=True)
class _State:
    """What one call knows of the bucket: the server's clock and the epoch."""

    now_ms: int
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class _Decision:
    """Decides one claim: its outcome, and the record to write (``None``: none)."""

    node: str
    lease_ms: int
    now: int
    forgot_before_ms: int | None
    epoch: str
    """The token of the epoch the decision was made in."""
    hold_off: bool = False

    def __call__(
        self,
        request: ClaimRequest,
        held: _Record | _Unreadable | None,
        running: _Record | None = None,
    ) -> tuple[Outcome, _Record | None]:
        """``running``: the record of the request's run lease, if it has one."""
        if isinstance(held, _Unreadable):
            return Outcome.CORRUPT, None
        outcome = judge(
            request,
            held,
            self.node,
            self.now,
            self.forgot_before_ms,
            running=running,
            hold_off=self.hold_off,
        )
        r = request
        if outcome in (Outcome.FORGOTTEN, Outcome.OVERLAP):
            until = self.now + r.memory_ms
            return outcome, _Record(self.node, True, until, r.memory_ms, r.tag, r.revision)
        if not outcome.is_won:
            return outcome, None
        until = self.now + self.lease_ms
        return outcome, _Record(self.node, False, until, r.memory_ms, r.tag, r.revision)


@dataclass(frozen=True, slots=True)
class _Settle:
    """Decides a commit (or a release): the record to write, ``None`` when it is not the
    node's to settle."""

    node: str
    now: int
    commit: bool
    epoch: str

    def __call__(self, record: _Record | _Unreadable | None) -> _Record | None:
        node, now = self.node, self.now
        if not isinstance(record, _Record) or record.node != node:
            return None
        if self.commit:
            if record.until_ms < now:
                return None
            until = now + record.memory_ms
            return _Record(node, True, until, record.memory_ms, record.tag, record.revision)
        if record.committed or record.until_ms < now:
            return None
        return _Record(node, False, now - 1, record.memory_ms, record.tag, record.revision)


def _claim_key(id_: str) -> str:
    if not isinstance(id_, str) or not _KEY.fullmatch(id_):
        raise ConfigError(
            f"nats store: firing id {id_!r} cannot be a key: use letters, digits and -/_=."
        )
    return f"claim.{id_}"


def _raise_unless_wrong_last(exc: JetStreamError) -> None:
    if exc.err_code != WRONG_LAST_SEQUENCE:
        raise exc
