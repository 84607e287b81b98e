"""The live revision in a claim record whose last field is the node's name (Redis, Redis
Cluster, NATS): see "Claim records" in :mod:`beatless.stores.base`.

The revision follows the node as ``\\x1f{revision}`` (the byte 0x1f, then decimal digits),
and a claim without one writes nothing there. A beatless that does not know the suffix
reads it as part of the node's name, a name none of its nodes has: it judges the claim
another node's, which it is, and nothing else changes for it.
"""

from __future__ import annotations

import re

REVISION_MARK = "\x1f"
_SUFFIX = re.compile(r"\x1f([0-9]+)\Z")


def with_revision(node: str, revision: int | None) -> str:
    """The node field of a record written by a claim of ``revision``."""
    return node if revision is None else f"{node}{REVISION_MARK}{revision}"


def split_revision(field: str) -> tuple[str, int | None]:
    """The node and the revision of a record's node field (``None``: not recorded)."""
    found = _SUFFIX.search(field)
    if found is None:
        return field, None
    return field[: found.start()], int(found.group(1))
