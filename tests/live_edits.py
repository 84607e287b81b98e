"""Random live edits, and the check of a send against the revision in force: shared by
the simulated fleet (``test_live_fleet_sim.py``) and the fault test of live entries
(``faults/test_faults_live.py``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from beatless import Entry, Every, Firing
from beatless.live import Live, entry_in_force
from beatless.live.codec import entry_from_json
from beatless.live.revisions import Revision, state

MAX_LATE_S = 8


def definition(name: str, rng: random.Random, edit: int, prefix: str) -> Entry:
    """A definition of ``name`` (task ``{prefix}.{name}``): every 1, 2 or 3 s (with
    jitter inside its window at times), args naming the edit that wrote it."""
    every_s = rng.choice((1, 2, 3))
    jitter_ms = rng.choice((0, 0, 200, 400 * every_s))
    return Entry(
        name=name,
        task=f"{prefix}.{name}",
        trigger=Every(every_s),
        args=(edit, name),
        jitter=timedelta(milliseconds=min(jitter_ms, 499 * every_s)),
        max_late=f"{MAX_LATE_S}s",
    )


def edit(
    live: Live,
    rng: random.Random,
    number: int,
    present: set[str],
    *,
    names: Sequence[str],
    prefix: str,
) -> Revision:
    """One random revision: a put (new, changed or created again), a delete of one or
    two names, or a batch of puts; each with the default fence (commit + 2 s) or a later
    one. ``present`` follows the names live once it is written."""
    how: dict[str, Any] = {"note": f"edit {number}"}
    if rng.random() < 0.3:
        how["effective_in"] = f"{rng.choice((2.5, 3, 4))}s"
    roll = rng.random()
    if roll < 0.2 and len(present) > 1:
        gone = rng.sample(sorted(present), rng.randint(1, min(2, len(present))))
        revision = live.delete_many(gone, **how)
        present -= set(gone)
        return revision
    if roll < 0.4:
        batch = rng.sample(list(names), rng.randint(2, 4))
        revision = live.put_many([definition(n, rng, number, prefix) for n in batch], **how)
        present |= set(batch)
        return revision
    name = rng.choice(list(names))
    revision = live.put(definition(name, rng, number, prefix), **how)
    present.add(name)
    return revision


def misrun(
    revisions: Sequence[Revision],
    name: str,
    occurrence: int,
    task: str,
    args: list[Any],
    *,
    by: str = "a node",
) -> str | None:
    """Why a send of ``name`` at ``occurrence`` with ``task`` and ``args`` is not the
    definition in force at that occurrence (``None``: it is): none in force then, one
    disabled, or one whose trigger (within its window) has no such occurrence, or sends
    another task or other args."""
    data = entry_in_force(revisions, name, occurrence)
    said = f"{name}@{occurrence} by {by} (args {args})"
    if data is None:
        return f"{said}: no such live entry in force then (before its fence, or deleted)"
    entry = entry_from_json(dict(data))
    if not entry.enabled:
        return f"{said}: the entry in force is disabled"
    if next(iter(entry.windowed.after(occurrence - 1)), None) != occurrence:
        return f"{said}: not an occurrence of {entry.describe()}, the trigger in force"
    if task != entry.task or args != list(entry.args):
        return f"{said}: the revision in force sends {entry.task} with args {list(entry.args)}"
    return None


def firings_in_force(
    revisions: Sequence[Revision], namespace: str, start_ms: int, end_ms: int
) -> dict[str, Firing]:
    """Every firing of a live entry whose occurrence is in ``[start_ms, end_ms]``, by id:
    each occurrence of the definition in force at it (from one fence to the next, the
    state at that revision), within the entry's window; none of a disabled one."""
    ordered = sorted(revisions, key=lambda r: r.number)
    fences = [r.fence_ms for r in ordered[1:]] + [end_ms + 1]
    firings: dict[str, Firing] = {}
    for revision, next_fence in zip(ordered, fences, strict=True):
        lo, hi = max(revision.fence_ms, start_ms), min(next_fence - 1, end_ms)
        if lo > hi:
            continue
        for name, data in state(ordered, revision.number).items():
            entry = entry_from_json(dict(data))
            if not entry.enabled:
                continue
            for occurrence in entry.windowed.after(lo - 1):
                if occurrence > hi:
                    break
                firing = Firing.of(entry, None, f"{namespace}/{name}", occurrence)
                firings[firing.id] = firing
    return firings


def misrun_send(revisions: Sequence[Revision], send: dict[str, Any]) -> str | None:
    """:func:`misrun` of one line of a fault node's record (``fault_node``)."""
    occurrence = int(send["occurrence_ms"])
    return misrun(revisions, send["entry"], occurrence, send["task"], send["args"], by=send["node"])
