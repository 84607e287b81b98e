"""The worker side of a firing, for Celery: each task checked as it starts.

:func:`~beatless.celery.install` arms it for the app's workers. A task whose message
carries :data:`~beatless.node.runs.RUN_HEADER` (every beatless firing's does) is checked in
the claim store before its body runs (:mod:`beatless.node.runs`): the firing id is the task
id, the address the ``beatless_address`` header, the attempt ``request.retries`` (each
Celery retry is a new attempt). A run that may not proceed (``duplicate``,
``skipped_overlap``) raises :class:`celery.exceptions.Ignore`: Celery marks the task
``IGNORED`` and acknowledges its message, ``acks_late`` or not. A run that proceeds is
ended (its once-only record committed, its run lease released) however the body ends:
a result, an exception, a retry. A message without the header (a call by hand, an
eager ``apply``, a message of stock beat) runs untouched.

**The seam.** On ``worker_init`` (the worker's main process, before the pool starts)
each task's ``run`` is wrapped, as an attribute of the task object; tasks named
``celery.*`` are left alone. Celery builds each task's tracer with ``task.run`` (or
the task itself when its class overrides ``__call__``; ``super().__call__`` calls
``self.run`` in a worker), in the main process for the threads and solo pools and in
each prefork child after the fork, so every pool calls the wrapper, inside the tracer:
``task.request`` is the message's request, and ``Ignore`` is handled as Celery handles
it from a task body. A prefork child started as a fresh interpreter
(``worker_pool_start_method = "spawn"``) rebuilds the worker's app from its
configuration: on ``worker_process_init`` the gate installed for the app of that name
(the app module's, imported there too) arms it, and its tracers are built again.

Task hooks were no fit: ``before_start`` is looked up on the task's class, and
``after_return`` is not called on a retry, which would leave a run's records to lapse
instead of being released; ``task_prerun`` cannot refuse a task (Celery logs a
receiver's exception and goes on).

**The store.** Each process that checks a task opens its own claim store on first use,
the scheduler's (``beatless_store_url``, the app's namespace), with one heartbeat
thread; its node name is ``hostname:pid``, as the scheduler's. A store that cannot be
reached is waited for up to ``beatless_check_wait``; then, or at once for a store the
settings cannot name, the check gets the verdict :mod:`beatless.node.runs` gives an
unreachable store: a once-only check is given up (``unchecked``), an overlap ``skip``
refuses the run.

**Counters.** :meth:`RunGate.counts` is what this process decided (``run``, ``rerun``,
``unchecked``, ``duplicate``, ``skipped_overlap``, ``lease_lost``, ``waited`` for the
store, and what became of the unchecked runs: ``recorded_late``, ``ran_twice``,
``unrecorded``, and of runs that ended cut off from it: ``committed_late``,
``uncommitted``); the bootstep keeps the gate as
:attr:`~beatless.celery.BeatlessStep.runs`. A prefork child keeps its own counts: each
process logs its counts at INFO when it ends.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import signals
from celery.exceptions import Ignore

from beatless.celery._messages import ADDRESS_HEADER, _header
from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import ConfigError, StoreError
from beatless.node.runs import DEFAULT_CHECK_WAIT, RUN_HEADER, Run, RunPolicy, Runs
from beatless.stores.base import ClaimStore

logger = logging.getLogger("beatless.node.runs")

_WRAPPED = "__beatless_unguarded__"
"""The attribute of a wrapper that holds the ``run`` it wraps."""


class RunGate:
    """The run checks of one Celery app in this process: armed once per worker."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hostname: str | None = None
        """The worker's node name, once armed."""
        self.guarded: tuple[str, ...] = ()
        """The names of the tasks whose ``run`` this gate wrapped."""
        self._lock = threading.Lock()
        self._runs: Runs | None = None
        self._pid = 0

    def __repr__(self) -> str:
        return f"RunGate({getattr(self.app, 'main', None)!r}, hostname={self.hostname!r})"

    @property
    def armed(self) -> bool:
        return self.hostname is not None

    # -- arming ----------------------------------------------------------------------

    def arm(self, hostname: str) -> list[str]:
        """Wrap the ``run`` of every task of the app not wrapped yet (``celery.*`` left
        alone); the names of those wrapped now."""
        self.hostname = hostname
        wrapped = []
        for name, task in list(self.app.tasks.items()):
            if name.startswith("celery.") or hasattr(task.__dict__.get("run"), _WRAPPED):
                continue
            task.run = self._guard(task, task.run)
            wrapped.append(name)
        self.guarded = (*self.guarded, *wrapped)
        if wrapped:
            logger.debug(
                "beatless: %d task(s) checked at start: %s",
                len(wrapped),
                shown(wrapped, quoted=False, limit=ERROR_LIMIT),
            )
        return wrapped

    def rebuild_tracers(self, hostname: str) -> None:
        """Build each task's tracer again, as a prefork child does before
        ``worker_process_init``, so that it calls the wrapped ``run``."""
        from celery.app.trace import build_tracer

        for name, task in self.app.tasks.items():
            task.__trace__ = build_tracer(name, task, self.app.loader, hostname, app=self.app)

    def _guard(self, task: Any, run: Callable[..., Any]) -> Callable[..., Any]:
        gate = self

        @functools.wraps(run)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            checked = gate.check(task.request)
            if checked is None:
                return run(*args, **kwargs)
            runs, started = checked
            if not started.proceed:
                raise Ignore(f"beatless: {started.verdict}")
            try:
                return run(*args, **kwargs)
            finally:
                runs.end(started)

        setattr(guarded, _WRAPPED, run)
        return guarded

    # -- checking a run ----------------------------------------------------------------

    def check(self, request: Any) -> tuple[Runs, Run] | None:
        """The run of ``request`` as the claim store judged it, or ``None`` when the
        message carries no run policy (or one with nothing to check)."""
        policy = RunPolicy.decode(_header(request, RUN_HEADER))
        if policy is None or not policy.guarded:
            return None
        firing_id = getattr(request, "id", None)
        address = _header(request, ADDRESS_HEADER)
        if not firing_id or not address:
            return None
        attempt = int(getattr(request, "retries", 0) or 0)
        runs = self.runs()
        return runs, runs.start(str(firing_id), str(address), policy, attempt)

    def runs(self) -> Runs:
        """The runs of this process: made on first use in each process."""
        pid = os.getpid()
        with self._lock:
            if self._runs is None or self._pid != pid:
                node = f"{self.hostname or 'celery'}:{pid}"
                runs = Runs(self._open_store, node, check_wait=self._check_wait())
                self._runs, self._pid = runs, pid
            return self._runs

    def counts(self) -> dict[str, int]:
        """What this process decided so far, per verdict (see :class:`~beatless.node.runs.Run`)."""
        runs = self._runs
        return dict(runs.counts) if runs is not None and self._pid == os.getpid() else {}

    def _check_wait(self) -> timedelta:
        """``beatless_check_wait``; the default when the settings are refused (the store
        cannot be opened then, and an error that is not an outage is not waited for)."""
        from beatless.celery._settings import CelerySettings

        try:
            return CelerySettings.from_app(self.app).check_wait
        except ConfigError:
            return DEFAULT_CHECK_WAIT

    def _open_store(self) -> ClaimStore:
        from beatless.celery._schedule import open_claim_store
        from beatless.celery._settings import CelerySettings

        try:
            return open_claim_store(CelerySettings.from_app(self.app))
        except ConfigError as exc:
            raise StoreError(f"the beatless settings name no usable store: {exc}") from None

    def close(self) -> None:
        """Log this process's counts and close its store (a process that checked
        nothing says nothing)."""
        with self._lock:
            runs, self._runs = self._runs, None
        if runs is None or self._pid != os.getpid():
            return
        if runs.counts:
            said = ", ".join(f"{k}={v}" for k, v in sorted(runs.counts.items()))
            logger.info(
                "beatless runs of node %s: %s",
                shown(runs.node, quoted=False),
                shown(said, quoted=False, limit=ERROR_LIMIT),
            )
        runs.close()


# -- one gate per app, armed by the worker's signals --------------------------------------

_GATES: weakref.WeakKeyDictionary[Any, RunGate] = weakref.WeakKeyDictionary()


def gate_of(app: Any) -> RunGate:
    """The gate of ``app``, made (and the worker signals connected) on first call."""
    gate = _GATES.get(app)
    if gate is None:
        gate = _GATES[app] = RunGate(app)
        _connect_signals()
    return gate


@functools.cache
def _connect_signals() -> None:
    """Connect the worker signals, once per process: each finds its app's gate."""
    signals.worker_init.connect(_on_worker_init, weak=False)
    signals.worker_process_init.connect(_on_process_init, weak=False)
    signals.worker_process_shutdown.connect(_on_shutdown, weak=False)
    signals.worker_shutdown.connect(_on_shutdown, weak=False)


def find_gate(app: Any) -> RunGate | None:
    try:
        return _GATES.get(app)
    except TypeError:  # not weakly referenceable: no gate
        return None


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    gate = find_gate(getattr(sender, "app", None))
    if gate is not None:
        gate.arm(str(sender.hostname))


def _on_process_init(sender: Any = None, **_: Any) -> None:
    """A prefork child forked from an armed main process inherits its wrapped tasks and
    built its tracers from them; one started as a fresh interpreter is armed here."""
    if not os.environ.get("FORKED_BY_MULTIPROCESSING"):
        return
    from celery import current_app

    app = current_app._get_current_object()
    gate = find_gate(app) or _spawned_gate(app)
    if gate is not None and not gate.armed:
        gate.arm(str(sender))
        gate.rebuild_tracers(str(sender))


def _spawned_gate(app: Any) -> RunGate | None:
    """In a fresh child the worker's app is rebuilt from its pickled configuration (a new
    object), while importing the app's module ran ``install`` on the module's own app:
    a gate installed for an app of the same main name stands for the rebuilt one."""
    main = getattr(app, "main", None)
    if not main or not any(getattr(g.app, "main", None) == main for g in list(_GATES.values())):
        return None
    return gate_of(app)


def _on_shutdown(**_: Any) -> None:
    for gate in list(_GATES.values()):
        gate.close()
