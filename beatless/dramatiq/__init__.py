"""Dramatiq periodic tasks with no scheduler process and no leader.

Add one middleware to the broker and declare periodic actors next to their code::

    import dramatiq
    from beatless.dramatiq import Beatless, cron, every

    broker.add_middleware(Beatless(store="redis://localhost:6379/0"))

    @dramatiq.actor(periodic=cron("0 2 * * *", jitter="2m"))
    def nightly_report() -> None: ...

Every worker node runs one scheduler; the claim store lets exactly one node enqueue
each firing. The message id is the firing id, ``message_timestamp`` the occurrence.
"""

from __future__ import annotations

from beatless.dramatiq.messages import (
    ENTRY_OPTION,
    OCCURRENCE_OPTION,
    TENANT_OPTION,
    message_for,
    occurrence,
    tenant,
)
from beatless.dramatiq.middleware import Beatless
from beatless.dramatiq.periodic import Periodic, cron, every

__all__ = [
    "ENTRY_OPTION",
    "OCCURRENCE_OPTION",
    "TENANT_OPTION",
    "Beatless",
    "Periodic",
    "cron",
    "every",
    "message_for",
    "occurrence",
    "tenant",
]
