"""The worker's side of a firing: run leases (overlap) and once-only execution.

A beatless message carries its entry's run policy in one header, :data:`RUN_HEADER`
(:meth:`RunPolicy.encode`), beside its firing id and address. When a worker starts such
a task it asks the claim store, in one claim of up to two records:

* **once-only** (``once_only``, on by default): the record of this firing's attempt
  (:func:`~beatless.schedule.firing.executed_id`). Won: this is the first copy to run. Held by a
  live claim, or committed: another copy runs or ran; this one is refused, counted
  ``duplicate``. Taken over: an earlier copy started and stopped renewing (its worker
  died); this one runs, counted ``rerun``. Committed when the run ends and remembered for
  the entry's memory (``jitter + max_late + 10 s``).
* **run lease** (``overlap = "skip"``): the record of the address
  (:func:`~beatless.schedule.firing.run_lease_id`). Won: no other run of the address is in
  progress; held until the run ends. Held by another run: this one is refused, counted
  ``skipped_overlap`` (and its once-only record committed, so that a later copy of the
  same firing is refused too).

Both records are claims in the claim store (:mod:`beatless.stores.base`), pending while
the run goes on and renewed every ``heartbeat`` by one thread per worker process. A
worker killed mid-run stops renewing: its records lapse ``run_lease`` after the last
heartbeat, and the address is free again.

When the store cannot be reached at the start of a run (it answers
:class:`~beatless.errors.StoreUnavailable`), the check waits for it: it is tried again
every :data:`CHECK_EVERY_S` for up to the worker's ``check_wait`` (:data:`DEFAULT_CHECK_WAIT`,
counted ``waited``), so that a store restarted or a link cut for less than that costs no
run without its check. The second copy of a firing sent twice (the two-phase window) is
sent only once the store answers again, and a copy that was checked, however late, is
judged by the store like any other: of two copies, one runs and the other is refused.
Once ``check_wait`` has passed (or at once for any other
:class:`~beatless.errors.StoreError`), a once-only check is given up (the task runs,
counted ``unchecked``, with a WARNING: never dropped unseen) while a run lease is not (the
task is refused, counted ``skipped_overlap``: two runs at once is what ``skip`` promises
never to allow).

An ``unchecked`` run is not left unrecorded: the heartbeat thread records it late
(:mod:`beatless.node._unchecked`). Nor is a run whose once-only record could not be
committed at its end (the store cut off as the task returned): the heartbeat thread
commits it once the store answers (counted ``committed_late``), so that a second copy
sent meanwhile is refused rather than run once the record lapses.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import DurationLike, as_timedelta, describe
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.node._run_records import (
    RUN_HEADER,
    RUN_RECORD_MEMORY_MS,
    Run,
    RunPolicy,
    _record,
    _requests,
)
from beatless.node._unchecked import (
    ANOTHER_COPY,
    OFFSET_EVERY_S,
    RECORD_EVERY_S,
    UncheckedRecords,
)
from beatless.schedule.firing import executed_id, run_lease_id
from beatless.stores.base import NEVER_LATE_MS, ClaimRequest, ClaimStore, Outcome

logger = logging.getLogger("beatless.node.runs")

__all__ = [
    "CHECK_EVERY_S",
    "DEFAULT_CHECK_WAIT",
    "NEVER_LATE_MS",
    "OFFSET_EVERY_S",
    "RECORD_EVERY_S",
    "RETRY_WAIT_MS",
    "RUN_HEADER",
    "RUN_RECORD_MEMORY_MS",
    "Run",
    "RunPolicy",
    "Runs",
    "check_wait",
]

RETRY_WAIT_MS = 5_000
"""How long a framework retry of a firing (attempt > 0) with overlap ``skip`` waits for
the attempt that sent it to release the address's run lease."""

DEFAULT_CHECK_WAIT = timedelta(seconds=30)
"""How long a run's check waits for a store that cannot be reached before it gives up
(``beatless_check_wait``, ``Beatless(check_wait=...)``): a store restart or failover
within it costs no ``unchecked`` run, and a task starts at most this late for it."""

CHECK_EVERY_S = 0.5
"""How often a run's check tries the store again while it waits for it (from the start of
one try to the next)."""


def check_wait(value: DurationLike, name: str = "check_wait") -> timedelta:
    """``value`` read as a worker's ``check_wait`` (``name`` in the error): a duration,
    zero (give a check up at its first failure) or more."""
    wait = as_timedelta(value, name=name)
    if wait < timedelta(0):
        raise ConfigError(f"{name}: must be zero or more, got {value!r}")
    return wait


class Runs(UncheckedRecords):
    """The runs of one worker process: checked at start, renewed, ended.

    ``open_store`` is called in the process that first needs a store (and again after a
    fork, or after :meth:`close`), so a prefork child never shares its parent's
    connection. The records are claimed on the store's clock: the process measures its
    offset to it when it opens the store and every minute, so a worker whose clock is off
    is neither refused as early nor judged late.

    A check that finds the store unreachable waits for it up to ``check_wait`` (see the
    module docstring) before it gives the check up.

    A copy of a firing that finds another copy's once-only record pending waits, asking
    again every ``heartbeat``, for at most one ``run_lease`` and a heartbeat: a record
    that keeps being renewed belongs to a live run (this copy is a ``duplicate``); one
    that lapses belonged to a worker that died (this copy runs, ``rerun``). A broker
    redelivers a dead worker's message at once, so without the wait the redelivered copy
    would be refused and the firing lost.
    """

    def __init__(
        self,
        open_store: Callable[[], ClaimStore],
        node: str,
        *,
        clock: Callable[[], float] = time.time,
        check_wait: timedelta = DEFAULT_CHECK_WAIT,
    ) -> None:
        self._open_store = open_store
        self.node = node
        self._clock = clock
        self.check_wait = check_wait
        self._store: ClaimStore | None = None
        self._pid = 0
        self._lock = threading.Lock()
        """Guards the store's opening and :attr:`_active`; never held across a round trip
        (the stores guard their own connections)."""
        self._active: dict[str, Run] = {}
        self._unrecorded: dict[str, Run] = {}
        """``unchecked`` runs whose once-only record is still to be recorded, by token."""
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._offset_ms = 0
        self._offset_at = -OFFSET_EVERY_S
        self.counts: dict[str, int] = {}

    # -- the process's store, clock and heartbeat ----------------------------------------

    def _ensure(self) -> ClaimStore:
        """The store of this process, opened (with its heartbeat thread) on first use.
        Raises :class:`~beatless.errors.StoreError` when it cannot be opened."""
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: nothing inherited
                self._pid = os.getpid()
                self._store, self._thread = None, None
                self._active, self._unrecorded = {}, {}
            if self._store is None:
                try:
                    self._store = self._open_store()
                except ConfigError as exc:
                    raise StoreError(f"the claim store cannot be opened: {exc}") from exc
                except OSError as exc:
                    raise StoreUnavailable(f"the claim store cannot be opened: {exc}") from exc
                self._offset_at = -OFFSET_EVERY_S
            self._start_beat()
            return self._store

    def _start_beat(self) -> None:
        """Start this process's heartbeat thread unless it runs (under :attr:`_lock`)."""
        self._closed = False
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._beat, name="beatless-runs", daemon=True)
            self._thread.start()

    def _now_ms(self) -> int:
        """The store's clock, as well as this process knows it."""
        return int(self._clock() * 1_000) + self._offset_ms

    def _measure_offset(self, store: ClaimStore) -> None:
        """Refresh the offset to the store's clock, at most once a minute."""
        now = time.monotonic()
        if now - self._offset_at < OFFSET_EVERY_S:
            return
        self._offset_at = now
        before = self._clock()
        try:
            server_ms = store.time_ms()
        except StoreError:
            return
        after = self._clock()
        self._offset_ms = server_ms - int((before + after) * 500)

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    # -- start ---------------------------------------------------------------------------

    def start(self, firing_id: str, address: str, policy: RunPolicy, attempt: int = 0) -> Run:
        """Check a run of ``firing_id`` (of ``address``) before the task body: the
        returned run says whether it may :attr:`~Run.proceed`. Every run that proceeds
        must be :meth:`end`-ed, however the task ends."""
        run = Run(firing_id, address, policy, f"{self.node}#{uuid.uuid4().hex[:8]}", "run")
        executed = executed_id(firing_id, attempt) if policy.once_only else ""
        try:
            requests, outcomes = self._check(run, attempt, executed)
        except StoreError as exc:
            return self._unreachable(run, exc, executed)
        self._judge(run, requests, outcomes, attempt)
        self._count(run.verdict)
        if run.held and run.proceed:
            run.next_renewal = time.monotonic() + policy.heartbeat_ms / 1_000
            with self._lock:
                self._active[run.token] = run
            self._wake.set()
        return run

    def _check(
        self, run: Run, attempt: int, executed: str
    ) -> tuple[list[ClaimRequest], list[Outcome]]:
        """Claim the run's records; while the store is unavailable, try again every
        :data:`CHECK_EVERY_S` until :attr:`check_wait` has passed since the first try, with
        the run's one token throughout (a claim of a try whose answer was lost is its
        own). Raises the last :class:`~beatless.errors.StoreError` when it gives up (saying
        for how long it tried, if it tried again)."""
        first = time.monotonic()
        deadline = first + self.check_wait.total_seconds()
        waited = False
        while True:
            began = time.monotonic()
            try:
                store = self._ensure()
                self._measure_offset(store)
                if executed:
                    self._record_earlier(store, executed)
                return self._claim_records(store, run, attempt)
            except StoreUnavailable as exc:
                now = time.monotonic()
                pause = max(began + CHECK_EVERY_S - now, 0.0)
                if now + pause >= deadline:
                    if not waited:
                        raise
                    raise StoreUnavailable(f"{exc} (tried for {now - first:.1f} s)") from None
                if not waited:
                    waited = True
                    self._count("waited")
                    logger.info(
                        "beatless: firing %s of %s waits for the claim store (up to %s) "
                        "before its check: %s",
                        run.firing_id,
                        shown(run.address),
                        describe(self.check_wait),
                        shown(exc, quoted=False, limit=ERROR_LIMIT),
                    )
                time.sleep(pause)

    def _claim_records(
        self, store: ClaimStore, run: Run, attempt: int
    ) -> tuple[list[ClaimRequest], list[Outcome]]:
        """Claim the run's records; while the once-only record is held by another copy,
        wait for that copy to end or lapse (see the class docstring)."""
        policy = run.policy
        began = time.monotonic()
        wait_ms = policy.lease_ms + min(policy.heartbeat_ms, policy.lease_ms // 2)
        copy_deadline = began + wait_ms / 1_000
        retry_deadline = began + min(policy.heartbeat_ms, RETRY_WAIT_MS) / 1_000
        while True:
            requests = _requests(run.firing_id, run.address, attempt, policy, self._now_ms())
            outcomes = store.claim(requests, node=run.token, lease_ms=policy.lease_ms)
            now = time.monotonic()
            if policy.once_only and outcomes[0] is Outcome.HELD and now < copy_deadline:
                pause = min(policy.heartbeat_ms / 1_000, 1.0, copy_deadline - now)
            elif (
                attempt > 0
                and policy.overlap == "skip"
                and outcomes[-1] is Outcome.HELD
                and now < retry_deadline
            ):
                # A retry sent by the attempt before it, which releases the address's run
                # lease only once its task has returned: let it.
                pause = min(0.1, retry_deadline - now)
            else:
                return requests, outcomes
            lease = [r.id for r, o in zip(requests, outcomes, strict=True) if o.is_won]
            lease = [i for i in lease if i != requests[0].id or not policy.once_only]
            if lease:
                store.release(lease, node=run.token)
            time.sleep(pause)

    def _unreachable(self, run: Run, exc: Exception, executed: str) -> Run:
        verdict = "skipped_overlap" if run.policy.overlap == "skip" else "unchecked"
        self._count(verdict)
        said = (
            "not run: its overlap policy is 'skip' and no run lease can be taken"
            if verdict == "skipped_overlap"
            else "run without its once-only check"
        )
        logger.warning(
            "beatless: firing %s of %s %s; the claim store cannot be reached: %s",
            run.firing_id,
            shown(run.address),
            shown(said, quoted=False, limit=ERROR_LIMIT),
            shown(exc, quoted=False, limit=ERROR_LIMIT),
        )
        run.verdict = verdict
        if verdict == "unchecked" and executed:
            run.unrecorded = executed
            with self._lock:
                if self._pid == os.getpid():
                    self._unrecorded[run.token] = run
                    self._start_beat()
            self._wake.set()
        return run

    def _judge(
        self, run: Run, requests: list[ClaimRequest], outcomes: list[Outcome], attempt: int
    ) -> Run:
        by_id = {r.id: o for r, o in zip(requests, outcomes, strict=True)}
        firing_id, policy = run.firing_id, run.policy
        executed = executed_id(firing_id, attempt) if policy.once_only else ""
        lease = run_lease_id(run.address) if policy.overlap == "skip" else ""
        run.held = tuple(i for i in (executed, lease) if i and by_id[i].is_won)
        run.executed = executed if executed in run.held else ""
        if executed:
            said = by_id[executed]
            if said in ANOTHER_COPY:
                logger.warning(
                    "beatless: firing %s of %s (attempt %d) not run: another copy of it %s",
                    firing_id,
                    shown(run.address),
                    attempt,
                    {
                        Outcome.HELD: "runs (its run has been renewed for a whole run_lease)",
                        Outcome.LOST: "ran",
                        Outcome.FORGOTTEN: "may have run before the claim store lost its memory",
                    }[said],
                )
                return self._refuse(run, "duplicate", commit=False)
            if said is Outcome.TAKEOVER:
                run.verdict = "rerun"
                logger.warning(
                    "beatless: firing %s of %s (attempt %d) runs again: an earlier copy "
                    "started and its worker stopped renewing its run (killed?)",
                    firing_id,
                    shown(run.address),
                    attempt,
                )
            elif not said.is_won:
                run.verdict = "unchecked"
                logger.warning(
                    "beatless: firing %s of %s runs without its once-only check: the claim "
                    "store answered %s",
                    firing_id,
                    shown(run.address),
                    said.value,
                )
        if lease and not by_id[lease].is_won:
            logger.info(
                "beatless: firing %s of %s not run: a run of %s is in progress "
                "(overlap 'skip'; store: %s)",
                firing_id,
                shown(run.address),
                shown(run.address),
                by_id[lease].value,
            )
            return self._refuse(run, "skipped_overlap", commit=True)
        return run

    def _refuse(self, run: Run, verdict: str, *, commit: bool) -> Run:
        """Refuse ``run``: release the run lease it won; commit its once-only record when
        ``commit`` (the firing is handled: skipped), else release it."""
        run.verdict = verdict
        lease = [i for i in run.held if i != run.executed]
        try:
            store = self._ensure()
            if lease:
                store.release(lease, node=run.token)
            if run.executed:
                if commit:
                    store.commit([run.executed], node=run.token)
                else:
                    store.release([run.executed], node=run.token)
        except StoreError as exc:
            logger.warning(
                "beatless: %s: %s", run.firing_id, shown(exc, quoted=False, limit=ERROR_LIMIT)
            )
        run.held, run.executed = (), ""
        return run

    # -- end -----------------------------------------------------------------------------

    def end(self, run: Run) -> None:
        """The run is over (whatever its result): commit its once-only record, release its
        run lease. Calling it twice, or for a refused run, does nothing. An ``unchecked``
        run whose record is not recorded yet keeps trying for the once-only memory."""
        with self._lock:
            if run._ended:
                return
            run._ended = True
            self._active.pop(run.token, None)
            if run.token in self._unrecorded:
                run.record_until = time.monotonic() + run.policy.memory_ms / 1_000
                return
        if not run.held:
            return
        lease = [i for i in run.held if i != run.executed]
        owed = bool(run.executed)
        try:
            store = self._ensure()
            if run.executed and not all(store.commit([run.executed], node=run.token)):
                self._owe_commit(run, "its once-only record lapsed before the run ended")
            owed = False
            if lease:
                store.release(lease, node=run.token)
        except StoreError as exc:
            if owed:
                self._owe_commit(run, shown(exc, quoted=False, limit=ERROR_LIMIT))
                return
            logger.warning(
                "beatless: firing %s of %s ended, but its run lease was not released (%s): "
                "it lapses %d ms after the last heartbeat",
                run.firing_id,
                shown(run.address),
                shown(exc, quoted=False, limit=ERROR_LIMIT),
                run.policy.lease_ms,
            )

    # -- heartbeat -----------------------------------------------------------------------

    def _beat(self) -> None:
        pid = os.getpid()
        while not self._closed and self._pid == pid:
            self._wake.wait(timeout=self._renew_due())
            self._wake.clear()

    def _renew_due(self) -> float:
        """Renew every run whose heartbeat is due, then try to record the ``unchecked``
        runs whose try is due; the seconds until the next of either."""
        now = time.monotonic()
        with self._lock:
            due = [r for r in self._active.values() if r.next_renewal <= now]
        store = self._store
        if store is not None:
            if due:
                self._measure_offset(store)
            for run in due:
                self._renew(store, run)
        self._record_due()
        with self._lock:
            upcoming = [r.next_renewal for r in self._active.values()]
            upcoming += [r.next_record for r in self._unrecorded.values()]
        return max(0.05, min(upcoming, default=now + 1.0) - time.monotonic())

    def _renew(self, store: ClaimStore, run: Run) -> None:
        run.next_renewal = time.monotonic() + run.policy.heartbeat_ms / 1_000
        now = self._now_ms()
        requests = [
            _record(i, run.address, now, run.policy.memory_ms if i == run.executed else None)
            for i in run.held
        ]
        try:
            outcomes = store.claim(requests, node=run.token, lease_ms=run.policy.lease_ms)
        except StoreError as exc:
            logger.warning(
                "beatless: heartbeat of firing %s of %s failed (%s); its run lease lapses "
                "%d ms after the last one that succeeded",
                run.firing_id,
                shown(run.address),
                shown(exc, quoted=False, limit=ERROR_LIMIT),
                run.policy.lease_ms,
            )
            return
        if not all(o.is_won for o in outcomes) and not run.lost:
            run.lost = True
            self._count("lease_lost")
            logger.error(
                "beatless: firing %s of %s still runs but lost its run records (%s): the "
                "worker paused longer than the run_lease of %d ms; another run of it may "
                "start",
                run.firing_id,
                shown(run.address),
                ", ".join(o.value for o in outcomes),
                run.policy.lease_ms,
            )

    def active(self) -> int:
        """Runs in progress in this process that hold records."""
        with self._lock:
            return len(self._active)

    def close(self) -> None:
        """Stop renewing and close the store; a later :meth:`start` opens it again."""
        self._closed = True
        self._wake.set()
        with self._lock:
            store, self._store = self._store, None
            mine = self._pid == os.getpid()
        if store is not None and mine:
            store.close()
