"""Live entries of a Dramatiq broker, given by actor.

:func:`live` returns a :class:`~beatless.live.Live` for the fleet of the broker's
``Beatless`` middleware: the claim store and namespace the middleware uses (its
``store``, else the broker's own server; its ``namespace``), its time zone, and its
entries and periodic actors as the code entries (writing one is refused unless
``override=True``). An entry is given by actor, and an actor the broker does not declare
is refused::

    entries = live(broker)
    entries.put("report", actor="reports.nightly", trigger=cron("0 4 * * *", jitter="2m"))
    entries.put("ping", actor=ping, trigger=Every("30s"), args=[1], note="monitoring")

``trigger`` is a declaration (:func:`~beatless.dramatiq.cron`,
:func:`~beatless.dramatiq.every`: read as ``periodic=`` reads it, its arguments and
timing with it) or a trigger (``Cron``, ``Every``) with ``args``, ``kwargs``, ``options``,
``tenants`` and the entry options beside it. Options not given take the middleware's
defaults, as for ``periodic=``.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from beatless.core.durations import DurationLike
from beatless.core.triggers import Trigger
from beatless.dramatiq._middleware import Beatless
from beatless.dramatiq._periodic import OPTION, Periodic, declarations
from beatless.errors import ConfigError
from beatless.live import Live, Plan, Revision
from beatless.live.api import DEFAULT_WINDOW
from beatless.node.dispatch import Dispatcher
from beatless.schedule.entry import Entry
from beatless.schedule.options import NAMES
from beatless.stores import open_store
from beatless.stores.base import ClaimStore

if TYPE_CHECKING:
    from dramatiq import Actor, Broker

ENTRY_KEYS = ("args", "kwargs", "options", "tenants", *NAMES)
"""What ``put`` passes to the entry beside its trigger; the other keywords are the
revision's (``note``, ``if_revision``, ``override``, ``effective_in``, ``at``)."""


def live(
    broker: Broker,
    *,
    store: ClaimStore | str | None = None,
    writer: str | None = None,
    host: str | None = None,
) -> DramatiqLive:
    """The live entries of the fleet of ``broker``'s ``Beatless`` middleware. ``store``
    (a URL or a claim store) replaces the middleware's; a store given (here or to the
    middleware) is left open, one opened here is closed by :meth:`~beatless.live.Live.close`."""
    middleware = _middleware(broker)
    namespace = middleware.address_namespace
    given = middleware.store if store is None else store
    if isinstance(given, Dispatcher):
        given = given.store
    if isinstance(given, ClaimStore):
        return DramatiqLive(broker, middleware, given, owns_store=False, writer=writer, host=host)
    opened = (
        open_store(store, namespace=namespace)
        if isinstance(store, str)
        else middleware.status_store(broker)
    )
    try:
        return DramatiqLive(broker, middleware, opened, owns_store=True, writer=writer, host=host)
    except BaseException:
        opened.close()
        raise


class DramatiqLive(Live):
    """A :class:`~beatless.live.Live` whose entries are given by actor:
    ``put(name, actor=..., trigger=...)``; every entry's task must be an actor of the
    broker."""

    def __init__(
        self,
        broker: Broker,
        middleware: Beatless,
        store: ClaimStore,
        **how: Any,
    ) -> None:
        """``how``: ``writer``, ``host``, ``owns_store`` as for :class:`~beatless.live.Live`."""
        super().__init__(
            store,
            namespace=middleware.address_namespace,
            code=_code_names(broker, middleware),
            timezone=middleware.timezone,
            **how,
        )
        self.broker = broker
        self.middleware = middleware

    def entry(
        self, name: str, *, actor: str | Actor[Any, Any], trigger: Trigger | Periodic, **given: Any
    ) -> Entry:
        """The entry ``name`` running ``actor`` on ``trigger``, with the middleware's
        defaults for the options not given (a declaration's own options first)."""
        task = self.actor_name(actor)
        defaults = self.middleware.settings.entry_defaults()
        if isinstance(trigger, Periodic):
            if given:
                raise ConfigError(
                    f"entry {name!r}: give {', '.join(sorted(given))} inside the declaration "
                    f"(cron(..., {next(iter(given))}=...)), or a trigger with them beside it"
                )
            return dataclasses.replace(trigger, name=name).entry(task, **defaults)
        return Entry(name=name, task=task, trigger=trigger, **(defaults | given))

    def actor_name(self, actor: str | Actor[Any, Any]) -> str:
        """The name of ``actor`` (a name or an actor), refused unless the broker declares it."""
        name = actor if isinstance(actor, str) else getattr(actor, "actor_name", None)
        if not isinstance(name, str) or name not in self.broker.actors:
            declared = ", ".join(sorted(self.broker.actors)) or "none"
            raise ConfigError(
                f"actor {name if name is not None else actor!r} is not declared by this "
                f"broker (declared: {declared}); import the module that declares it first"
            )
        return name

    def put(
        self,
        entry: Entry | str,
        *,
        actor: str | Actor[Any, Any] | None = None,
        trigger: Trigger | Periodic | None = None,
        **given: Any,
    ) -> Revision:
        """Put one entry: an :class:`~beatless.Entry`, or a name with ``actor`` and
        ``trigger`` (and ``args``, ``kwargs``, ``options``, ``tenants``, entry options);
        ``note``, ``if_revision``, ``override``, ``effective_in``, ``at`` as for
        :meth:`~beatless.live.Live.put_many`."""
        how = {key: value for key, value in given.items() if key not in ENTRY_KEYS}
        if isinstance(entry, Entry):
            if actor is not None or trigger is not None or len(how) < len(given):
                raise ConfigError(
                    f"put: give an Entry, or a name with actor and trigger: {entry!r}"
                )
            return super().put(entry, **how)
        if actor is None or trigger is None:
            raise ConfigError(f"put {entry!r}: give actor= and trigger=")
        parts = {key: value for key, value in given.items() if key in ENTRY_KEYS}
        return super().put(self.entry(entry, actor=actor, trigger=trigger, **parts), **how)

    def put_many(self, entries: Sequence[Entry], **how: Any) -> Revision:
        """Put ``entries`` as one revision, each task an actor of the broker."""
        for entry in entries:
            self.actor_name(entry.task)
        return super().put_many(entries, **how)

    def plan(
        self, entries: Sequence[Entry], window: DurationLike = DEFAULT_WINDOW, **how: Any
    ) -> Plan:
        """See :meth:`~beatless.live.Live.plan`; each task must be an actor of the broker."""
        for entry in entries:
            self.actor_name(entry.task)
        return super().plan(entries, window, **how)


def _middleware(broker: Broker) -> Beatless:
    found = [m for m in broker.middleware if isinstance(m, Beatless)]
    if len(found) != 1:
        raise ConfigError(
            f"live entries: the broker has {len(found)} Beatless middleware; add exactly "
            f"one: broker.add_middleware(Beatless(...))"
        )
    return found[0]


def _code_names(broker: Broker, middleware: Beatless) -> builtins.list[str]:
    """The names of the middleware's entries and of the broker's periodic actors."""
    names = [entry.name for entry in middleware.entries]
    for actor in list(broker.actors.values()):
        value = actor.options.get(OPTION)
        if value is None:
            continue
        try:
            declared = declarations(actor.actor_name, value)
        except ConfigError:  # reported by the node and `beatless check`, not here
            declared = [Periodic(trigger=None, name=actor.actor_name)]
        names += [periodic.name or actor.actor_name for periodic in declared]
    return names
