"""A ``celery beat`` scheduler that any number of beat processes can run at once.

    app.conf.beat_scheduler = "beatless.celery:Scheduler"

or ``celery -A proj beat -S beatless.celery:Scheduler``. Every beat process computes the
same firings from ``beat_schedule`` and claims each in the shared store; only the winner
enqueues it. Nothing is kept in a local schedule file.

Beat's own default entries (``celery.backend_cleanup``) are not added: they would run
on every beat host at once; declare the cleanup in ``beat_schedule`` if you need it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import beat

from beatless.celery.schedule import CeleryScheduler, build_scheduler
from beatless.celery.settings import CelerySettings
from beatless.errors import ConfigError
from beatless.urls import mask_url

logger = logging.getLogger(__name__)


class Scheduler(beat.Scheduler):  # type: ignore[misc]
    """``celery.beat.Scheduler`` driving a beatless scheduler: ``tick`` claims and
    enqueues the firings due now and returns the seconds until the next wake."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.beatless: CeleryScheduler | None = None
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        self.beatless = build_scheduler(self.app)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One wake of the beatless scheduler; the seconds until the next one, at most
        ``max_interval`` and one second."""
        scheduler = self.beatless
        if scheduler is None:
            scheduler = self.beatless = build_scheduler(self.app)
        try:
            scheduler.tick()
        except Exception:
            logger.exception("beatless wake failed; beat goes on")
        return scheduler.sleep_s(float(self.max_interval))

    def sync(self) -> None:
        """Nothing to persist: the claims are the state, and they live in the store."""

    def close(self) -> None:
        beatless, self.beatless = self.beatless, None
        if beatless is not None:
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
