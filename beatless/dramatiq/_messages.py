"""What a firing becomes as a Dramatiq message, and how an actor reads it back.

The message id is the firing id and ``message_timestamp`` is the occurrence, both
un-jittered, so every node builds the same message and Dramatiq's ``max_age`` measures
the age of the occurrence, not of the send. Shared by the two-phase path
(``broker.enqueue``) and the atomic path (the message pushed by the claim script).

Beside the firing's own options, every message carries its address
(:data:`ADDRESS_OPTION`) and its entry's run policy (:data:`~beatless.node.runs.RUN_HEADER`,
:meth:`RunPolicy.encode <beatless.node.runs.RunPolicy.encode>`): what the worker needs to
check the run (overlap, once-only) before the actor's body, see
:meth:`beatless.dramatiq.Beatless.before_process_message`.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from beatless.errors import ConfigError
from beatless.node.runs import RUN_HEADER, RunPolicy
from beatless.schedule.firing import Firing, to_datetime

if TYPE_CHECKING:
    from dramatiq import Actor, Message

    from beatless.schedule.entry import Entry

OCCURRENCE_OPTION = "beatless_occurrence"
"""The nominal occurrence of the firing, integer epoch milliseconds (UTC)."""
ENTRY_OPTION = "beatless_entry"
TENANT_OPTION = "beatless_tenant"
OFFSET_OPTION = "beatless_offset_ms"
ADDRESS_OPTION = "beatless_address"
"""The firing's address (``namespace/entry`` or ``namespace/entry/tenant``): the run
lease a worker takes is the address's."""


def message_for(
    firing: Firing,
    actor: Actor[Any, Any],
    *,
    tenant_kwarg: str | None,
    extra: dict[str, Any] | None = None,
) -> Message[Any]:
    """The message of one firing for ``actor``: the same on every node, but for the
    ``extra`` options a broker adds (the Redis broker's message id)."""
    from dramatiq import Message

    entry = firing.entry
    kwargs = dict(entry.kwargs)
    options: dict[str, Any] = {
        **entry.options,
        OCCURRENCE_OPTION: firing.occurrence_ms,
        ENTRY_OPTION: entry.name,
        OFFSET_OPTION: firing.offset_ms,
        ADDRESS_OPTION: firing.address,
        RUN_HEADER: _run_policy(entry),
    }
    if extra:
        options.update(extra)
    if firing.tenant is not None:
        options[TENANT_OPTION] = firing.tenant
        if tenant_kwarg is not None:
            kwargs[tenant_kwarg] = firing.tenant
    return Message(
        queue_name=actor.queue_name,
        actor_name=actor.actor_name,
        args=entry.args,
        kwargs=kwargs,
        options=options,
        message_id=firing.id,
        message_timestamp=firing.occurrence_ms,
    )


@lru_cache(maxsize=4_096)
def _run_policy(entry: Entry) -> str:
    """The encoded run policy of an entry (entries are compared by identity): once per
    entry, not once per firing."""
    return RunPolicy.of_entry(entry).encode()


def _current(message: Any) -> Any:
    if message is not None:
        return message
    from dramatiq.middleware import CurrentMessage

    current = CurrentMessage.get_current_message()
    if current is None:
        raise ConfigError(
            "no message given and no current message: pass the message, or add "
            "dramatiq.middleware.CurrentMessage to the broker and call this inside an actor"
        )
    return current


def occurrence(message: Any = None) -> datetime | None:
    """The occurrence a message was sent for, as an aware UTC datetime; ``None`` for a
    message beatless did not send. With no argument, the message being processed (this
    needs Dramatiq's ``CurrentMessage`` middleware)."""
    value = _current(message).options.get(OCCURRENCE_OPTION)
    return None if value is None else to_datetime(int(value))


def tenant(message: Any = None) -> str | None:
    """The tenant of a fan-out firing's message, ``None`` otherwise (see :func:`occurrence`)."""
    value = _current(message).options.get(TENANT_OPTION)
    return None if value is None else str(value)
