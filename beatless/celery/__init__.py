"""beatless for Celery: run periodic tasks from every worker, or as any number of beats.

* In every worker, no beat: ``beatless.celery.install(app)`` (the bootstep is
  :class:`BeatlessStep`; ``Beatless``, its first name, still loads it, with a
  ``DeprecationWarning``).
* As ``celery beat`` on any number of hosts:
  ``beat_scheduler = "beatless.celery:BeatScheduler"`` (``Scheduler`` is the same class,
  under the name first documented).
* In a task: ``beatless.celery.occurrence(self.request)`` is the nominal occurrence;
  ``beatless.celery.task_firing_id(self.request)`` the firing id, which is the task id.
* Before a deploy: ``beatless check --celery proj.celery:app`` (:func:`check_app`).
* At run time: ``beatless.celery.live(app).put(name, beat_schedule_item)`` writes a live
  entry (:mod:`beatless.celery._live`; RedBeat's ``entry.save()``, ported).
* Moving from RedBeat: ``beatless.celery.import_redbeat(app, "redbeat://host:6379/0")``
  writes RedBeat's entries as live entries, one revision (:mod:`beatless.celery._redbeat`;
  ``beatless schedule import`` on the command line).
* In production: ``celery -A proj beatless status`` (the fleet, from the claim store) and
  ``celery -A proj inspect beatless`` (each worker's scheduler, over remote control).

Importing this module imports Celery, never a broker driver.
"""

from __future__ import annotations

import warnings
from typing import Any

from beatless.celery import _control as control  # noqa: F401 - registers `celery inspect beatless`
from beatless.celery._beat import BeatScheduler, Scheduler
from beatless.celery._live import CeleryLive, live
from beatless.celery._messages import occurrence, task_firing_id, tenant
from beatless.celery._redbeat import RedBeatImport, import_redbeat
from beatless.celery._schedule import (
    CeleryScheduler,
    build_scheduler,
    check_app,
    read_schedule,
)
from beatless.celery._settings import CelerySettings
from beatless.celery._worker import BeatlessStep, install

__all__ = [
    "BeatScheduler",
    "BeatlessStep",
    "CeleryLive",
    "CeleryScheduler",
    "CelerySettings",
    "RedBeatImport",
    "Scheduler",
    "build_scheduler",
    "check_app",
    "import_redbeat",
    "install",
    "live",
    "occurrence",
    "read_schedule",
    "task_firing_id",
    "tenant",
]


RENAMED = {"Beatless": "BeatlessStep"}
"""Names this module had, and what they are called now: still importable, with a
``DeprecationWarning``."""


def __getattr__(name: str) -> Any:
    if name in RENAMED:
        warnings.warn(
            f"beatless.celery.{name} is renamed beatless.celery.{RENAMED[name]}; the old "
            f"name will be removed in a future release",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
