"""Writing ``last_run_at`` and ``total_run_count`` back to the rows (off by default).

django-celery-beat's admin shows when a row last ran and how often. With
``beatless_django_write_back = True``, each node counts the firings of the bridge's
entries that it sent itself (won: one node per firing, so no run is counted twice, and
manual run-now firings are not counted, as django-celery-beat does not count its admin's
runs) and, once a second from its poll thread, writes them: per row, one ``UPDATE`` in
autocommit that moves ``last_run_at`` forward to the latest occurrence sent (never back,
whatever order nodes write in) and adds the count to ``total_run_count``. No
``SELECT ... FOR UPDATE``, no transaction held across rows, nothing written from the
scheduler's loop: the loop only appends to a dict.

Neither column is part of a row's digest, and an ``update()`` moves neither
``date_changed`` nor ``PeriodicTasks.last_update``: writing back never republishes a row.
"""

from __future__ import annotations

import threading
from typing import Any

from beatless.core._time import to_datetime
from beatless.django._mapping import HEADER
from beatless.schedule.firing import Decision
from beatless.schedule.outcomes import DecisionOutcome

SENT = (DecisionOutcome.WON, DecisionOutcome.TAKEOVER)


class WriteBack:
    """This node's sent firings of the bridge's entries, written to their rows by
    :meth:`flush` (``rows``: :class:`~beatless.django._orm.DjangoRows`)."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows
        self._pending: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def decided(self, decision: Decision) -> None:
        """The scheduler's ``on_decision`` hook: note a sent firing of a row's entry."""
        firing = decision.firing
        entry = firing.entry
        headers = entry.options.get("headers")
        if decision.outcome not in SENT or firing.manual or not isinstance(headers, dict):
            return
        if headers.get(HEADER) != entry.name:  # not an entry of the bridge
            return
        with self._lock:
            latest, count = self._pending.get(entry.name, (firing.occurrence_ms, 0))
            self._pending[entry.name] = (max(latest, firing.occurrence_ms), count + 1)

    def flush(self) -> int:
        """Write what was noted since the last flush; the rows written. What fails to be
        written is noted again, for the next flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        try:
            self.rows.record_runs({n: (to_datetime(ms), c) for n, (ms, c) in pending.items()})
        except BaseException:
            with self._lock:
                for name, (ms, count) in pending.items():
                    latest, more = self._pending.get(name, (ms, 0))
                    self._pending[name] = (max(latest, ms), count + more)
            raise
        return len(pending)
