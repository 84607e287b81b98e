"""Dramatiq periodic tasks with no scheduler process and no leader.

Add one middleware to the broker and declare periodic actors next to their code::

    import dramatiq
    from beatless.dramatiq import Beatless, cron, every

    broker.add_middleware(Beatless(store="redis://localhost:6379/0", namespace="myapp"))

    @dramatiq.actor(periodic=cron("0 2 * * *", jitter="2m", max_late="5m"))
    def nightly_report() -> None: ...

Every worker node runs one scheduler; the claim store lets exactly one node enqueue
each firing. The message id is the firing id, ``message_timestamp`` the occurrence.
Before an actor runs a firing, its worker checks the entry's run policy (``overlap``,
``run_lease``, ``heartbeat``, ``once_only``) in the same claim store.
A schedule with problems stops the worker with :class:`ScheduleRefused`, listing every
problem (``on_schedule_error="consume"``: the node consumes, and schedules the entries
without a problem of their own, or nothing when a problem is the whole schedule's).
Before a deploy: ``beatless check --dramatiq myapp.broker myapp.tasks``.
"""

from __future__ import annotations

from beatless.dramatiq._live import live as live
from beatless.dramatiq._messages import (
    ADDRESS_OPTION,
    ENTRY_OPTION,
    OCCURRENCE_OPTION,
    TENANT_OPTION,
    message_for,
    occurrence,
    tenant,
)
from beatless.dramatiq._middleware import Beatless, ScheduleRefused
from beatless.dramatiq._periodic import Periodic, at, cron, every, solar

__all__ = [
    "ADDRESS_OPTION",
    "ENTRY_OPTION",
    "OCCURRENCE_OPTION",
    "TENANT_OPTION",
    "Beatless",
    "Periodic",
    "ScheduleRefused",
    "at",
    "cron",
    "every",
    "message_for",
    "occurrence",
    "solar",
    "tenant",
]
