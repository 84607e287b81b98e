"""A ``celery beat`` scheduler that any number of beat processes can run at once.

    app.conf.beat_scheduler = "beatless.celery:BeatScheduler"

or ``celery -A proj beat -S beatless.celery:BeatScheduler``. Every beat process computes
the same firings from ``beat_schedule`` and claims each in the shared store; only the
winner enqueues it. Nothing is kept in a local schedule file. ``beatless.celery:Scheduler``
names the same class, so configurations written with that name keep working.

Beat's own default entries (``celery.backend_cleanup``) are not added: they would run
on every beat host at once; declare the cleanup in ``beat_schedule`` if you need it.

With ``beatless_django`` on, each beat process also runs the django-celery-beat bridge
(:mod:`beatless.django`), as a worker node does.

A schedule with problems stops beat at start with one error listing every problem,
whatever ``beatless_on_schedule_error`` says: a beat process does nothing but schedule.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import beat

from beatless.celery._schedule import CeleryScheduler, build_scheduler, check_app
from beatless.celery._settings import CelerySettings
from beatless.celery._worker import publish_metrics, start_bridge
from beatless.core.urls import mask_url
from beatless.errors import ConfigError
from beatless.ops import metrics
from beatless.schedule.problems import refusal

logger = logging.getLogger(__name__)


class BeatScheduler(beat.Scheduler):  # type: ignore[misc]
    """``celery.beat.Scheduler`` driving a beatless scheduler: ``tick`` claims and
    enqueues the firings due now and returns the seconds until the next wake."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.beatless: CeleryScheduler | None = None
        self.bridge: Any = None
        """The django-celery-beat bridge's poll duty (``beatless_django``), else ``None``."""
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        self.beatless = self._build()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One wake of the beatless scheduler, then a chunk of the messages due within a
        second built ahead (``0``: beat calls again at once, as the loop of a worker node
        does); else the seconds until the next wake, at most ``max_interval`` and one
        second."""
        scheduler = self.beatless
        if scheduler is None:
            scheduler = self.beatless = self._build()
        try:
            scheduler.tick()
        except Exception:
            logger.exception("beatless wake failed; beat goes on")
        return scheduler.idle_s(float(self.max_interval))

    def _build(self) -> CeleryScheduler:
        found = check_app(self.app)
        if found.schedule is None:
            raise refusal(found.problems, consume_with=None)  # beat only schedules: no consume
        settings = CelerySettings.from_app(self.app)
        scheduler = build_scheduler(
            self.app, settings=settings, schedule=found.schedule, framework="celery beat"
        )
        scheduler.board.start()  # beat drives the loop's wakes; the registry runs beside it
        publish_metrics(scheduler, settings)
        try:
            self.bridge = start_bridge(self.app, scheduler, settings)
        except BaseException:
            scheduler.close()
            raise
        return scheduler

    def sync(self) -> None:
        """Nothing to persist: the claims are the state, and they live in the store."""

    def close(self) -> None:
        bridge, self.bridge = self.bridge, None
        if bridge is not None:
            bridge.stop()
        beatless, self.beatless = self.beatless, None
        if beatless is not None:
            metrics.unregister(beatless)
            beatless.close()

    @property
    def info(self) -> str:
        try:
            settings = CelerySettings.from_app(self.app)
        except ConfigError as exc:
            return f"    . beatless -> {exc}"
        path = "atomic where routing allows" if settings.atomic else "two-phase"
        return (
            f"    . beatless store -> {mask_url(settings.store_url)} "
            f"(namespace {settings.namespace!r}, {path})"
        )


Scheduler = BeatScheduler
"""The name ``beat_scheduler = "beatless.celery:Scheduler"`` was first written with."""
