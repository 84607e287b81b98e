"""beatless for Celery: run periodic tasks from every worker, or as any number of beats.

* In every worker, no beat: ``beatless.celery.install(app)``.
* As ``celery beat`` on any number of hosts: ``beat_scheduler = "beatless.celery:Scheduler"``.
* In a task: ``beatless.celery.occurrence(self.request)`` is the nominal occurrence;
  the task id is the firing id.

Importing this module imports Celery, never a broker driver.
"""

from __future__ import annotations

from beatless.celery.beat import Scheduler
from beatless.celery.messages import firing_id, occurrence, tenant
from beatless.celery.schedule import CeleryScheduler, build_scheduler, read_schedule
from beatless.celery.settings import CelerySettings
from beatless.celery.worker import Beatless, install

__all__ = [
    "Beatless",
    "CeleryScheduler",
    "CelerySettings",
    "Scheduler",
    "build_scheduler",
    "firing_id",
    "install",
    "occurrence",
    "read_schedule",
    "tenant",
]
