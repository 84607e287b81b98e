"""beatless for django-celery-beat: its rows, edited in the Django admin, as live entries.

Turn it on with a Celery setting beside :func:`beatless.celery.install`::

    app.conf.beatless_django = True      # CELERY_BEATLESS_DJANGO = True in Django settings
    beatless.celery.install(app)

and stop the ``celery beat`` process. Every worker node then schedules the rows of
``PeriodicTask`` as live entries owned by ``django`` (:mod:`beatless.live`): one node a
second, chosen by the claim store, reads what changed in the Django database and
publishes it as a revision; the others never touch that database.

* :func:`entry_of_row` and :func:`row_of`: a row as the entry that runs it (pure).
* :class:`Bridge`: change detection and publishing, one poll at a time.
* :func:`start_bridge`: what the Celery worker calls with ``beatless_django`` on.
"""

from __future__ import annotations

from beatless.django._bridge import OWNER, Bridge, PollResult
from beatless.django._duty import PollDuty
from beatless.django._mapping import Row, RowRefused, entry_of_row, row_of
from beatless.django._orm import DjangoRows, Probe
from beatless.django._start import start_bridge

__all__ = [
    "OWNER",
    "Bridge",
    "DjangoRows",
    "PollDuty",
    "PollResult",
    "Probe",
    "Row",
    "RowRefused",
    "entry_of_row",
    "row_of",
    "start_bridge",
]
