"""Starting the bridge in a Celery worker node: what the worker calls with
``beatless_django`` on.

Settings (``app.conf``, or ``CELERY_BEATLESS_DJANGO...`` in a Django project that reads
Celery's settings from its own with the ``CELERY`` namespace):

=================================  ==========================================================
``beatless_django``                ``True``: the worker nodes schedule django-celery-beat's
                                   rows (:mod:`beatless.django`). Default: off.
``beatless_django_database``       The Django database alias of the rows. Default: the one
                                   Django's routers choose (``default``).
``beatless_django_hash_every``     Seconds between two full passes (every row read and
                                   compared), which find changes no marker shows:
                                   ``queryset.update()``, raw SQL. Default: 60.
``beatless_django_write_back``     Write ``last_run_at`` and ``total_run_count`` of the rows
                                   this node sent, once a second, with no row lock held
                                   past one ``UPDATE`` (:mod:`beatless.django._writeback`).
                                   Default: False.
=================================  ==========================================================
"""

from __future__ import annotations

import socket
from typing import Any

from beatless.celery._schedule import CeleryScheduler
from beatless.celery._settings import CelerySettings
from beatless.core.durations import as_timedelta
from beatless.django._bridge import OWNER, Bridge
from beatless.django._duty import HASH_EVERY_S, PollDuty
from beatless.django._orm import DjangoRows
from beatless.django._writeback import WriteBack
from beatless.errors import ConfigError
from beatless.live.api import Live
from beatless.schedule.firing import Decision


def django_ready() -> Any:
    """Django's settings, Django set up first if the app's loader has not done it (Celery's
    Django fix-up does it in a worker whose ``DJANGO_SETTINGS_MODULE`` is set)."""
    try:
        import django
        from django.apps import apps
        from django.conf import settings
    except ImportError:
        raise ConfigError(
            "beatless_django: Django is not installed: pip install 'beatless[django]'"
        ) from None
    if not apps.ready:
        try:
            django.setup()
        except Exception as exc:  # ImproperlyConfigured and whatever the settings raise
            raise ConfigError(
                f"beatless_django: Django cannot be set up ({exc}); set "
                f"DJANGO_SETTINGS_MODULE in the worker's environment"
            ) from None
    if not apps.is_installed("django_celery_beat"):
        raise ConfigError(
            "beatless_django: 'django_celery_beat' is not in INSTALLED_APPS: its rows are "
            "what the bridge schedules"
        )
    return settings


def hash_every(app: Any) -> int:
    value = app.conf.get("beatless_django_hash_every", HASH_EVERY_S)
    seconds = as_timedelta(value, name="beatless_django_hash_every").total_seconds()
    if seconds < 1 or seconds != int(seconds):
        raise ConfigError(
            f"beatless_django_hash_every must be a whole number of seconds, at least 1; "
            f"got {value!r}"
        )
    return int(seconds)


def _write_back(app: Any, scheduler: CeleryScheduler, rows: DjangoRows) -> WriteBack | None:
    """The write-back of ``beatless_django_write_back``, hooked to the scheduler's
    decisions (after any hook it had), else ``None``."""
    value = app.conf.get("beatless_django_write_back", False)
    if not isinstance(value, bool):
        raise ConfigError(f"beatless_django_write_back must be True or False, got {value!r}")
    if not value:
        return None
    write_back = WriteBack(rows)
    before = scheduler.on_decision

    def decided(decision: Decision) -> None:
        if before is not None:
            before(decision)
        write_back.decided(decision)

    scheduler.on_decision = decided
    return write_back


def start_bridge(app: Any, scheduler: CeleryScheduler, settings: CelerySettings) -> PollDuty:
    """Start the poll duty of this node (its thread), publishing into the node's claim
    store and namespace; stop it with :meth:`PollDuty.stop`."""
    django_settings = django_ready()
    rows = DjangoRows(app.conf.get("beatless_django_database"))
    live = Live(
        scheduler.claim_store,
        namespace=settings.namespace,
        code=[entry.name for entry in scheduler.schedule.entries],
        writer="django-celery-beat",
        host=socket.gethostname(),
        timezone=settings.timezone,
        owner=OWNER,
    )
    tz_aware = bool(getattr(django_settings, "DJANGO_CELERY_BEAT_TZ_AWARE", True))
    preference = scheduler.preference
    write_back = _write_back(app, scheduler, rows)
    duty = PollDuty(
        Bridge(live, rows, settings, tz_aware=tz_aware),
        scheduler.claim_store,
        node=scheduler.node,
        namespace=settings.namespace,
        view=lambda: preference.view if preference.enabled else None,
        clock=scheduler.clock,
        hash_every_s=hash_every(app),
        close=rows.close,
        each_second=write_back.flush if write_back is not None else lambda: None,
    )
    duty.start()
    return duty
