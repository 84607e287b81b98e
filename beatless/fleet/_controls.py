"""What an operator sets through the claim store: pause, resume, run-now, and their audit.

Controls are notes (:class:`~beatless.stores.base.Note`) every node reads at each sync
of its board, every second, so a pause or a run-now is honoured by every node within a
second:

* **pause** (kind ``beatless/{namespace}/controls``, key: the entry): while it holds, a
  firing of the entry is not claimed; each node counts it ``paused`` and it goes into
  the address's history as such, never as missed. ``--until`` ends it by itself (the
  note lives until then); otherwise it holds until ``resume``.
* **run-now** (kind ``beatless/{namespace}/run-now``, key: the request's id): one manual
  firing of the entry (and tenant), claimed like any other so exactly one node sends it.
  Its id is derived from the request, so it never equals a scheduled firing's id; its
  occurrence is the instant of the request on the store's clock.
* every control adds an **audit** record (kind ``beatless/{namespace}/audit``): what,
  which entry, who, from which host, when; the last ``AUDIT_KEEP`` for ``AUDIT_TTL_MS``.

A store that keeps notes for a limited time (:attr:`~beatless.stores.base.ClaimStore.
notes_live_ms`: NATS, RabbitMQ, 24 h) keeps audit records that long, and a pause that
must outlive it is posted again by the nodes that read it, each time half of that time
has passed since its last post (:func:`refreshed`).
"""

from __future__ import annotations

import getpass
import json
import socket
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from beatless.fleet._schema import CONTROL, BadNote, Skipped, parse_each
from beatless.schedule.firing import Firing, manual_id
from beatless.stores.base import ClaimStore, Note

CONTROL_FOREVER_MS = 366 * 24 * 3_600_000
"""How long a pause without ``--until`` is kept: until resumed, in practice."""
RESUMED_TTL_MS = 24 * 3_600_000
"""How long the note that an entry was resumed is kept (so status can say by whom)."""
RUN_NOW_TTL_MS = 600_000
"""A run-now request no node saw within this long is dropped (it would be late anyway)."""
AUDIT_KEEP = 1_000
AUDIT_TTL_MS = 30 * 24 * 3_600_000


def controls_kind(namespace: str) -> str:
    return f"beatless/{namespace}/controls"


def run_now_kind(namespace: str) -> str:
    return f"beatless/{namespace}/run-now"


def audit_kind(namespace: str) -> str:
    return f"beatless/{namespace}/audit"


def json_text(value: Mapping[str, Any]) -> str:
    """A note's value: compact JSON, keys sorted (equal values are equal text)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True, slots=True)
class Control:
    """An operator's action, as kept in the store."""

    action: str
    """``pause``, ``resume`` or ``run-now``."""
    entry: str
    by: str
    host: str
    at_ms: int
    """When it was set, on the store's clock."""
    until_ms: int | None = None
    """A pause's end; ``None``: until resumed."""
    tenant: str | None = None
    request: str = ""
    """A run-now's id."""
    posted_ms: int = 0
    """When its note was last posted (a long pause is posted again, see :func:`refreshed`)."""

    def to_json(self) -> str:
        return json_text(asdict(self))

    @classmethod
    def parse(cls, text: str) -> Control:
        """The control, checked against :data:`~beatless.fleet._schema.CONTROL`; raises
        :class:`~beatless.fleet._schema.BadNote`."""
        return cls(**CONTROL.load(text))

    @classmethod
    def from_json(cls, text: str) -> Control | None:
        """The control, or ``None`` for one that does not fit its schema."""
        try:
            return cls.parse(text)
        except BadNote:
            return None

    def pauses(self, now_ms: int) -> bool:
        """Whether this control pauses its entry at ``now_ms``."""
        return self.action == "pause" and (self.until_ms is None or now_ms < self.until_ms)


def operator() -> tuple[str, str]:
    """Who sets a control, and from where."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without one): said as such
        user = "unknown"
    return user, socket.gethostname()


def set_control(
    store: ClaimStore,
    namespace: str,
    action: str,
    entry: str,
    *,
    until_ms: int | None = None,
    tenant: str | None = None,
) -> Control:
    """Write a control and its audit record in one post; returns what was written."""
    now = store.time_ms()
    by, host = operator()
    control = Control(
        action,
        entry,
        by,
        host,
        now,
        until_ms=until_ms,
        tenant=tenant,
        request=uuid.uuid4().hex if action == "run-now" else "",
        posted_ms=now,
    )
    live = store.notes_live_ms
    if action == "pause":
        note = _pause_note(namespace, control, now, live)
    elif action == "resume":
        ttl = capped_ttl(RESUMED_TTL_MS, live)
        note = Note(controls_kind(namespace), entry, control.to_json(), ttl)
    else:
        note = Note(run_now_kind(namespace), control.request, control.to_json(), RUN_NOW_TTL_MS)
    audit = Note(
        audit_kind(namespace),
        f"{now:013d}-{uuid.uuid4().hex[:8]}",
        control.to_json(),
        capped_ttl(AUDIT_TTL_MS, live),
        keep=AUDIT_KEEP,
    )
    store.post([note, audit])
    return control


def capped_ttl(ttl_ms: int, live_ms: int | None) -> int:
    """``ttl_ms``, or the store's :attr:`~beatless.stores.base.ClaimStore.notes_live_ms`
    if that is shorter."""
    return ttl_ms if live_ms is None else min(ttl_ms, live_ms)


def _pause_note(namespace: str, control: Control, now: int, live_ms: int | None) -> Note:
    """A pause's note: living until the pause ends, or as long as the store allows."""
    wanted = CONTROL_FOREVER_MS if control.until_ms is None else max(control.until_ms - now, 1)
    return Note(
        controls_kind(namespace), control.entry, control.to_json(), capped_ttl(wanted, live_ms)
    )


def refreshed(namespace: str, control: Control, now: int, live_ms: int | None) -> Note | None:
    """The pause note to post again, on a store that keeps notes for less time than the
    pause must last, once half that time has passed since its last post; else ``None``."""
    if live_ms is None or not control.pauses(now) or now - control.posted_ms < live_ms // 2:
        return None
    if control.until_ms is not None and control.until_ms - now <= live_ms // 2:
        return None  # the note it has outlives the pause
    return _pause_note(namespace, replace(control, posted_ms=now), now, live_ms)


def read_controls(
    notes: Mapping[str, str], namespace: str, skipped: Skipped | None = None
) -> dict[str, Control]:
    """The controls of ``namespace``'s controls notes, by entry: those that fit their
    schema and whose entry is their key (the others are told to ``skipped``)."""
    kind = controls_kind(namespace)
    controls = {}
    for entry, control in parse_each(kind, notes, Control.parse, skipped):
        if control.entry != entry:
            if skipped is not None:
                named = json.dumps(control.entry[:80])
                why = f"its entry {named} is not its key (the entry it controls)"
                skipped.skip(kind, entry, notes[entry], why)
            continue
        controls[entry] = control
    return controls


def read_requests(
    notes: Mapping[str, str], namespace: str, skipped: Skipped | None = None
) -> dict[str, Control]:
    """The run-now requests of ``namespace``'s run-now notes, by key: those that fit their
    schema (the others are told to ``skipped``)."""
    return dict(parse_each(run_now_kind(namespace), notes, Control.parse, skipped))


def read_audit(
    notes: Mapping[str, str], namespace: str, skipped: Skipped | None = None, last: int = 20
) -> list[Control]:
    """The last ``last`` audit records, oldest first (of those that fit their schema;
    the others are told to ``skipped``)."""
    recent = {key: notes[key] for key in sorted(notes)[-last:]}
    return [c for _, c in parse_each(audit_kind(namespace), recent, Control.parse, skipped)]


def manual_firing(firing: Firing, request: str) -> Firing:
    """The firing a run-now request makes of a scheduled one: same entry, tenant and
    address, released at once, with an id no scheduled firing has."""
    return replace(firing, id=manual_id(firing.address, request), offset_ms=0, manual=True)
