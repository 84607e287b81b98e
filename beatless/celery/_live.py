"""Live entries of a Celery app, written in the shape of a ``beat_schedule`` item.

:func:`live` returns a :class:`~beatless.live.Live` for the app's fleet: the claim store
and namespace :meth:`CelerySettings.from_app <beatless.celery._settings.CelerySettings.from_app>`
decides (``beatless_store_url``, else the broker's own server; ``beatless_namespace``,
else ``app.main``), the app's time zone, and the app's own ``beat_schedule`` names as the
code entries (writing one is refused unless ``override=True``).

Its ``put``, ``put_many`` and ``plan`` take, beside :class:`~beatless.Entry` values, a
name and a ``beat_schedule`` item, converted exactly as a node reads ``beat_schedule``
(:func:`beatless.celery._schedule.read_entry`): ``crontab`` in the app's zone (or its
``nowfun``'s), ``schedule``/``timedelta``/numbers anchored to the epoch, beatless
settings in ``options["beatless"]`` with the app's ``beatless_*`` defaults. So RedBeat
code ports line by line::

    RedBeatSchedulerEntry("report", "app.report", crontab(hour=4), args=[1], app=app).save()
    live(app).put("report", {"task": "app.report", "schedule": crontab(hour=4), "args": [1]})
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from beatless.celery._schedule import open_claim_store, read_entry
from beatless.celery._settings import CelerySettings
from beatless.core.durations import DurationLike
from beatless.errors import ConfigError
from beatless.live import Live, Plan, Revision
from beatless.live.api import DEFAULT_WINDOW
from beatless.schedule.entry import Entry
from beatless.stores.base import ClaimStore

Items = Sequence[Entry] | Mapping[str, Any]
"""Entries, or a ``beat_schedule``-shaped dict ``{name: item}``."""


def live(
    app: Any,
    *,
    store: ClaimStore | str | None = None,
    writer: str | None = None,
    host: str | None = None,
) -> CeleryLive:
    """The live entries of ``app``'s fleet. ``store`` (a URL or a claim store) replaces
    the app's claim store; a store given is left open, one opened here is closed by
    :meth:`~beatless.live.Live.close` (or ``with live(app) as entries: ...``)."""
    settings = CelerySettings.from_app(app)
    if isinstance(store, ClaimStore):
        return CeleryLive(app, settings, store, owns_store=False, writer=writer, host=host)
    opened = open_claim_store(settings, store)
    try:
        return CeleryLive(app, settings, opened, owns_store=True, writer=writer, host=host)
    except BaseException:
        opened.close()
        raise


class CeleryLive(Live):
    """A :class:`~beatless.live.Live` whose writes also take ``beat_schedule`` items:
    ``put(name, item)``, ``put_many({name: item, ...})``, ``plan({name: item, ...})``."""

    def __init__(
        self,
        app: Any,
        settings: CelerySettings,
        store: ClaimStore,
        **how: Any,
    ) -> None:
        """``how``: ``writer``, ``host``, ``owns_store`` as for :class:`~beatless.live.Live`."""
        super().__init__(
            store,
            namespace=settings.namespace,
            code=_code_names(app),
            timezone=settings.timezone,
            **how,
        )
        self.app = app
        self.settings = settings

    def entry(self, name: str, item: Any) -> Entry:
        """The entry of one ``beat_schedule`` item, as a node of this app reads it."""
        return read_entry(name, item, self.settings)

    def entries(self, items: Items) -> builtins.list[Entry]:
        """``items`` as entries: a ``{name: item}`` dict converted, entries as they are."""
        if isinstance(items, Mapping):
            return [self.entry(name, item) for name, item in items.items()]
        return list(items)

    def put(self, entry: Entry | str, item: Any = None, **how: Any) -> Revision:
        """Put one entry, or the ``beat_schedule`` item ``item`` named ``entry``; ``how``
        as for :meth:`~beatless.live.Live.put_many`."""
        if isinstance(entry, Entry):
            if item is not None:
                raise ConfigError(f"put: give an Entry, or a name and an item, not both ({item!r})")
            return super().put(entry, **how)
        return super().put(self.entry(entry, item), **how)

    def put_many(self, entries: Items, **how: Any) -> Revision:
        """Put entries, or a ``beat_schedule``-shaped dict, as one revision."""
        return super().put_many(self.entries(entries), **how)

    def plan(self, entries: Items, window: DurationLike = DEFAULT_WINDOW, **how: Any) -> Plan:
        """What making the live entries equal to ``entries`` (or a ``beat_schedule``-shaped
        dict) would do; see :meth:`~beatless.live.Live.plan`."""
        return super().plan(self.entries(entries), window, **how)


def _code_names(app: Any) -> builtins.list[str]:
    """The names the app's own ``beat_schedule`` gives its code entries."""
    beat_schedule = app.conf.beat_schedule or {}
    return [str(name) for name in beat_schedule] if isinstance(beat_schedule, Mapping) else []
