"""Live entries: entries written at run time into the store, beside the code's.

Built so far: entries are stored and versioned. A change (one entry or a batch, put or
delete) is an immutable, numbered revision (:mod:`beatless.live.revisions`) with a
content hash, writer, host, note, commit time and fence on the store's clock; writers
serialize by claiming the next number with the store's own exactly-once claim
(:mod:`beatless.live._ledger`); entries are stored as JSON (:mod:`beatless.live.codec`);
:class:`Live` reads, writes, plans (:mod:`beatless.live.plan`) and reverts them.
Nodes schedule them (:mod:`beatless.node._live`).
"""

from __future__ import annotations

from beatless.live.api import Live
from beatless.live.codec import entry_from_json, entry_to_json
from beatless.live.plan import Plan
from beatless.live.revisions import Change, Revision, entry_in_force, in_force, state, state_hash

__all__ = [
    "Change",
    "Live",
    "Plan",
    "Revision",
    "entry_from_json",
    "entry_in_force",
    "entry_to_json",
    "in_force",
    "state",
    "state_hash",
]
