"""The schedule of a Dramatiq node: its entries and periodic actors, checked, and its scheduler.

:func:`check` gathers the middleware's ``entries`` and the entries the broker's actors
declare with the ``periodic`` option, and collects every problem at once, each naming its
entry: a bad declaration, a broken timing rule, a task that is no actor of the broker, a
message the encoder refuses, a missing namespace, a store whose driver is not installed.
It connects to nothing; what the worker refuses to start with and what ``beatless check
--dramatiq`` reports. :class:`SchedulerBuilder` makes the scheduler over a sound schedule, with its
claim store (:mod:`beatless.dramatiq._store`) and its bounded two-phase sender, and closes
what it opened.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from dramatiq import get_encoder

from beatless.core.durations import to_ms
from beatless.core.urls import mask_url
from beatless.dramatiq._messages import message_for
from beatless.dramatiq._periodic import OPTION, declarations
from beatless.dramatiq._sending import Sender
from beatless.dramatiq._settings import MEMORY_NAMESPACE, DramatiqSettings
from beatless.dramatiq._store import actor, actor_getter, claim_store
from beatless.fleet.limits import checked
from beatless.node.scheduler import Scheduler, send_deadline_s
from beatless.schedule.entry import Entry, Schedule, address_segment
from beatless.schedule.firing import Firing
from beatless.schedule.problems import (
    Checked,
    argument_problems,
    collect,
    labelled,
    one_line,
)
from beatless.stores import missing_driver

if TYPE_CHECKING:
    from dramatiq import Actor, Broker


def check(settings: DramatiqSettings, broker: Broker) -> Checked:
    """Every problem of the node's schedule at once, each naming its entry (see the
    module doc). Connects to nothing."""
    problems: list[str] = []
    namespace = collect(lambda: settings.address_namespace, problems)
    store = settings.store
    missing = missing_driver(store) if isinstance(store, str) else None
    whole = bool(problems) or missing is not None  # no part of the schedule is usable
    left_out: list[str] = []
    found = list(settings.entries)
    for declaring in list(broker.actors.values()):
        value = declaring.options.get(OPTION)
        if value is not None:
            found += _declared(settings, declaring, value, problems, left_out)
    for entry in found:
        own: list[str] = []
        named = collect(partial(actor, broker, entry.task, entry.name), own)
        if named is not None:
            own += _message_problems(settings, entry, named, namespace or MEMORY_NAMESPACE)
        problems += own
        if own:
            left_out.append(entry.name)
    if missing is not None:
        problems.append(f"Beatless store {mask_url(str(store))}: {missing}")
    return checked(
        found,
        problems,
        namespace=namespace or MEMORY_NAMESPACE,
        timezone=settings.timezone,
        left_out=None if whole else left_out,
    )


def _declared(
    settings: DramatiqSettings,
    declaring: Actor[Any, Any],
    value: object,
    problems: list[str],
    left_out: list[str],
) -> list[Entry]:
    """The entries an actor declares; what is wrong with any goes to ``problems``, and
    the name of each entry it keeps from being built to ``left_out`` (an actor's
    ``periodic`` value that is wrong as a whole: the actor's name)."""
    entries: list[Entry] = []
    defaults = settings.entry_defaults()
    name = declaring.actor_name
    found: list[str] = []
    for declared in collect(partial(declarations, name, value), found) or ():
        entry = collect(partial(declared.entry, name, **defaults), problems)
        if entry is None:
            left_out.append(declared.name or name)
        else:
            entries.append(entry)
    if found:
        problems += [labelled(f"entry {name!r}", problem) for problem in found]
        left_out.append(name)
    return entries


def _message_problems(
    settings: DramatiqSettings, entry: Entry, named: Actor[Any, Any], namespace: str
) -> list[str]:
    """Encode one message of the entry now, so that arguments the encoder refuses fail at
    start-up, named, rather than at every firing."""
    tenants = entry.tenants if isinstance(entry.tenants, tuple) else (None,)
    tenant = tenants[0] if tenants else None
    address = f"{namespace}/{address_segment(entry.name)}"
    firing = Firing.of(entry, tenant, address if tenant is None else f"{address}/{tenant}", 0)
    try:
        message_for(firing, named, tenant_kwarg=settings.tenant_kwarg).encode()
    except Exception as exc:  # any refusal of the encoder is the answer
        encoder = get_encoder()
        found = argument_problems(
            entry, lambda value: encoder.encode({"value": value}), type(encoder).__name__
        )
        return found or [
            f"entry {entry.name!r}: its message cannot be encoded ({one_line(str(exc))}); "
            f"give it options the broker's encoder accepts"
        ]
    return []


class SchedulerBuilder:
    """Makes this node's schedulers over a broker, and closes what it opened for them:
    claim stores and the two-phase sender's broker connections."""

    def __init__(self, settings: DramatiqSettings) -> None:
        self.settings = settings
        self.opened: list[Any] = []
        """What was opened here, closed by :meth:`close`."""

    def scheduler(self, broker: Broker, schedule: Schedule) -> Scheduler:
        """A scheduler for this node over ``broker`` (not started)."""
        settings = self.settings
        sender = self.sender(broker)
        store = claim_store(settings, broker, sender, self.opened)
        return Scheduler(
            schedule,
            store=store,
            enqueue=sender,
            clock=settings.clock,
            node=settings.node,
            lease=settings.lease,
            framework="dramatiq",
            preferred=settings.preferred_claimer,
            live=settings.live,
        )

    def sender(self, broker: Broker) -> Sender:
        """The two-phase enqueue of this node over ``broker``: ``broker.enqueue`` on
        connections of its own whose every send ends within
        :func:`~beatless.node.scheduler.send_deadline_s` of the lease."""
        sender = Sender(
            broker,
            deadline_s=send_deadline_s(to_ms(self.settings.lease)),
            actor_of=actor_getter(broker),
            tenant_kwarg=self.settings.tenant_kwarg,
        )
        self.opened.append(sender)
        return sender

    def close(self) -> None:
        """Close the stores and the broker connections opened here."""
        opened, self.opened = self.opened, []
        for store in opened:
            store.close()
