"""Recording an ``unchecked`` run late: what :class:`~beatless.node.runs.Runs` does for a
run whose check was given up.

An ``unchecked`` run is not left unrecorded: the heartbeat thread claims its once-only
record again, with the run's own token, every :data:`RECORD_EVERY_S`, until the store
answers. A claim the check gave up on may still reach the store late (a link that held
its bytes) and sit pending under that token: it is this run's own, so it is won again.
Won while the run goes on, the record is held and renewed like any other and committed
at the end; won after the run ended, it is committed at once (counted ``recorded_late``
either way). So a later copy of the firing is refused (``duplicate``) as it would have
been had the check succeeded. Found held or committed by another copy, this run was a
second copy that ran unchecked: counted ``ran_twice``, told once at WARNING, nothing
more to do. The tries stop when the store answers, or once the run has ended and the
once-only memory passed (counted ``unrecorded``): a copy arriving after that would not
be refused by a record anyway.

A checked run that ended while the store could not be reached (or whose record lapsed
before its end) owes only the commit of the record it won (:attr:`Run.commit_owed`): the
same thread commits it with the run's token once the store answers, claiming it again
first if it lapsed meanwhile (counted ``committed_late``). Without that, the record would
lapse a ``run_lease`` after the last heartbeat and a second copy sent during the cut
(the two-phase window) would take it over and run. Found taken by another copy, the
firing ran twice: counted ``ran_twice``, told at WARNING. Given up with the memory
(counted ``uncommitted``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import ConfigError, StoreError
from beatless.node._run_records import Run, _record
from beatless.stores.base import ClaimStore, Outcome

logger = logging.getLogger("beatless.node.runs")

RECORD_EVERY_S = 0.5
"""How often an ``unchecked`` run tries to record its once-only record (from the start of
one try to the next: a try the store does not answer takes its timeout)."""

OFFSET_EVERY_S = 60.0
"""How often a worker process measures its offset to the store's clock."""

ANOTHER_COPY = (Outcome.HELD, Outcome.LOST, Outcome.FORGOTTEN)


class UncheckedRecords:
    """The late recording of ``unchecked`` runs, a part of
    :class:`~beatless.node.runs.Runs`, whose state it shares."""

    _open_store: Callable[[], ClaimStore]
    _store: ClaimStore | None
    _pid: int
    _lock: threading.Lock
    _active: dict[str, Run]
    _unrecorded: dict[str, Run]
    _closed: bool
    _offset_at: float
    _wake: threading.Event

    def _now_ms(self) -> int:
        raise NotImplementedError

    def _start_beat(self) -> None:
        raise NotImplementedError

    def _count(self, name: str) -> None:
        raise NotImplementedError

    def _record_due(self) -> None:
        """Try to record each ``unchecked`` run whose try is due; stop at the first try the
        store does not answer (the others would wait for its timeout too)."""
        now = time.monotonic()
        with self._lock:
            due = [r for r in self._unrecorded.values() if r.next_record <= now]
        store = self._records_store() if due else None
        for run in due:
            if run.record_until is not None and now > run.record_until:
                self._give_up_record(run)
                continue
            run.next_record = time.monotonic() + RECORD_EVERY_S
            if store is None:
                continue
            try:
                self._write_record(store, run)
            except StoreError as exc:
                logger.debug(
                    "beatless: once-only record of firing %s of %s not written yet: %s",
                    run.firing_id,
                    shown(run.address),
                    shown(exc, quoted=False, limit=ERROR_LIMIT),
                )
                return

    def _records_store(self) -> ClaimStore | None:
        """The process's store for the heartbeat thread, opened again if a run's start
        could not open it; ``None`` once closed, or while it cannot be opened."""
        with self._lock:
            if self._closed or self._pid != os.getpid():
                return None
            if self._store is None:
                try:
                    self._store = self._open_store()
                except (ConfigError, OSError, StoreError):
                    return None
                self._offset_at = -OFFSET_EVERY_S
            return self._store

    def _record_earlier(self, store: ClaimStore, executed: str) -> None:
        """Before a copy of a firing is checked, record this process's ``unchecked`` run of
        the same firing, if any: that run is the first copy. Raises
        :class:`~beatless.errors.StoreError` when the store does not answer."""
        with self._lock:
            earlier = [r for r in self._unrecorded.values() if r.unrecorded == executed]
        for run in earlier:
            self._write_record(store, run)

    def _owe_commit(self, run: Run, why: str) -> None:
        """``run`` ended without its once-only record committed (``why``): commit it from
        the heartbeat thread once the store answers (see the module docstring)."""
        now = time.monotonic()
        run.unrecorded, run.commit_owed = run.executed, True
        run.next_record, run.record_until = now, now + run.policy.memory_ms / 1_000
        with self._lock:
            if self._pid == os.getpid():
                self._unrecorded[run.token] = run
                self._start_beat()
        self._wake.set()
        logger.warning(
            "beatless: firing %s of %s ran, but its once-only record is not committed yet "
            "(%s): it is committed once the claim store answers, so that a later copy of it "
            "is still refused",
            run.firing_id,
            shown(run.address),
            why,
        )

    def _write_record(self, store: ClaimStore, run: Run) -> None:
        """Claim ``run``'s once-only record with its own token; on an answer, hold it (the
        run goes on), commit it (the run ended), or tell that another copy has it. A
        commit owed is tried first as it is: the record may still be this run's."""
        record = run.unrecorded
        if run.commit_owed and all(store.commit([record], node=run.token)):
            with self._lock:
                if self._unrecorded.pop(run.token, None) is None:
                    return
            self._told_recorded(run)
            return
        request = _record(record, run.address, self._now_ms(), run.policy.memory_ms)
        (said,) = store.claim([request], node=run.token, lease_ms=run.policy.lease_ms)
        if said.is_won:
            with self._lock:
                if self._unrecorded.pop(run.token, None) is None:
                    return  # recorded meanwhile by another thread
                ended = run._ended
                if not ended:  # held and renewed from now on, committed by end()
                    run.held, run.executed = (record,), record
                    run.next_renewal = time.monotonic() + run.policy.heartbeat_ms / 1_000
                    self._active[run.token] = run
            if ended and not self._commit_record(store, run):
                return
            self._told_recorded(run)
            return
        with self._lock:
            if self._unrecorded.pop(run.token, None) is None:
                return
        if said in ANOTHER_COPY:
            self._count("ran_twice")
            logger.warning(
                "beatless: firing %s of %s %s: another copy of it %s",
                run.firing_id,
                shown(run.address),
                "ran, and its once-only record lapsed before it could be committed"
                if run.commit_owed
                else "ran without its once-only check and was a second copy",
                {
                    Outcome.HELD: "runs",
                    Outcome.LOST: "ran",
                    Outcome.FORGOTTEN: "may have run before the claim store lost its memory",
                }[said],
            )
        else:
            self._count("uncommitted" if run.commit_owed else "unrecorded")
            logger.warning(
                "beatless: firing %s of %s ran%s, and its once-only record cannot be "
                "written: the claim store answered %s",
                run.firing_id,
                shown(run.address),
                "" if run.commit_owed else " without its once-only check",
                said.value,
            )

    def _told_recorded(self, run: Run) -> None:
        """Count and tell that ``run``'s once-only record is written at last."""
        self._count("committed_late" if run.commit_owed else "recorded_late")
        logger.info(
            "beatless: firing %s of %s has its once-only record now that the claim store "
            "answers (it %s): a later copy of it is refused",
            run.firing_id,
            shown(run.address),
            "ended while the store could not be reached" if run.commit_owed else "ran unchecked",
        )

    def _commit_record(self, store: ClaimStore, run: Run) -> bool:
        """Commit the once-only record of ``run``, which ended; when that fails, put the
        run back among those to record (the next try claims the record again)."""
        try:
            committed = all(store.commit([run.unrecorded], node=run.token))
        except StoreError:
            committed = False
            raise
        finally:
            if not committed:
                with self._lock:
                    self._unrecorded.setdefault(run.token, run)
        return committed

    def _give_up_record(self, run: Run) -> None:
        with self._lock:
            if self._unrecorded.pop(run.token, None) is None:
                return
        self._count("uncommitted" if run.commit_owed else "unrecorded")
        logger.warning(
            "beatless: firing %s of %s ran%s, and the claim store could not be reached to "
            "record it for the entry's memory of %d ms after the run ended: a later copy of "
            "it would have run",
            run.firing_id,
            shown(run.address),
            "" if run.commit_owed else " without its once-only check",
            run.policy.memory_ms,
        )
