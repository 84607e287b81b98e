"""django-celery-beat's admin, with "Run selected tasks" through beatless's run-now.

django-celery-beat's action calls ``apply_async`` from the web process: a message no
node claimed, outside the audit, with a random id. :class:`PeriodicTaskAdmin` keeps
every other part of its admin and queues one manual firing of each selected row through
the store instead (as ``beatless run-now`` does): claimed once by the fleet, sent by the
node that wins it with the entry's options and headers, and kept in the audit. Register
it in place of django-celery-beat's, in an ``admin.py`` of the project::

    from django.contrib import admin
    from django_celery_beat.models import PeriodicTask

    from beatless.django.admin import PeriodicTaskAdmin

    admin.site.unregister(PeriodicTask)
    admin.site.register(PeriodicTask, PeriodicTaskAdmin)

The rows must be live entries of the fleet (``beatless_django`` on, the row scheduled):
a row the bridge refused has no entry to run, and the action says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import messages
from django_celery_beat.admin import PeriodicTaskAdmin as _Admin

from beatless.celery._schedule import open_claim_store
from beatless.celery._settings import CelerySettings
from beatless.django._bridge import OWNER
from beatless.fleet._controls import Control, set_control
from beatless.live.api import Live
from beatless.live.codec import owner_of


def run_now(app: Any, names: Sequence[str]) -> tuple[list[Control], list[str]]:
    """Queue one manual firing of each of ``names`` (rows the bridge publishes) in the
    fleet of Celery ``app``; the controls written, and the names that have no live entry
    owned by ``django`` (refused by the bridge, or not yet published)."""
    settings = CelerySettings.from_app(app)
    store = open_claim_store(settings)
    try:
        live = Live(store, namespace=settings.namespace, owner=OWNER)
        current = live.state()
        known = [n for n in names if n in current and owner_of(current[n]) == OWNER]
        controls = [set_control(store, settings.namespace, "run-now", name) for name in known]
        return controls, [n for n in names if n not in known]
    finally:
        store.close()


class PeriodicTaskAdmin(_Admin):  # type: ignore[misc]
    """django-celery-beat's ``PeriodicTaskAdmin``, its "Run selected tasks" through
    run-now."""

    def run_tasks(self, request: Any, queryset: Any) -> None:
        names = [task.name for task in queryset]
        controls, missing = run_now(self.celery_app, names)
        if controls:
            self.message_user(
                request,
                f"{len(controls)} task{'s' if len(controls) != 1 else ''} queued to run once "
                f"(beatless run-now: claimed by one node, within a second): "
                f"{', '.join(c.entry for c in controls)}",
            )
        if missing:
            self.message_user(
                request,
                f"not run, not scheduled by beatless (see the workers' warnings): "
                f"{', '.join(missing)}",
                level=messages.ERROR,
            )

    run_tasks.short_description = _Admin.run_tasks.short_description  # type: ignore[attr-defined]
