"""The worker bootstep: one beatless scheduler per worker node, no ``celery beat``.

Add it with one call, next to the app::

    import beatless.celery

    app = Celery("proj")
    beatless.celery.install(app)

or by hand with ``app.steps["worker"].add(beatless.celery.BeatlessStep)``. ``install``
also adds the ``--without-beatless`` worker option, which leaves the scheduler off on
that node (the node still consumes the tasks other nodes enqueue), and arms the run
checks (:mod:`beatless.celery._gate`): on every worker of the app, scheduling or not, a
beatless firing's task is checked in the claim store before its body runs (overlap
``skip``, once-only). A step added by hand schedules but does not check runs.

The step runs in the worker's main process, after the pool has started (prefork
children never run it), whatever the pool: prefork, threads or solo. The scheduler
loop runs in a daemon thread; a warm shutdown stops it after the wake in progress and
closes the claim store. The node name is the worker's hostname and process id. With
``beatless_metrics_port`` (or ``beatless_metrics_registry``) set, the main process
exports the node's Prometheus metrics (:mod:`beatless.ops.metrics`) until the step stops.

Before it schedules, the step checks the whole schedule (:func:`~beatless.celery.
schedule.check_app`), then opens the claim store and probes it. With problems, or a
store that cannot be reached or refuses the credentials, the worker does not start: it
exits with :data:`~beatless.schedule.problems.EXIT_REFUSED` after one CRITICAL message listing
every problem (for the store, one line naming it, its URL masked), with no traceback.
With ``beatless_on_schedule_error = "consume"`` it starts and consumes tasks; when each
problem is one entry's, it schedules the other entries and names each one left out in a
WARNING (and in its registry record, which ``beatless status`` reads); otherwise it
schedules nothing and says so once at ERROR. It keeps the problems in
:attr:`BeatlessStep.schedule_problems` (``celery inspect beatless`` shows them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from celery import bootsteps
from celery.exceptions import WorkerShutdown
from celery.utils.imports import symbol_by_name

from beatless.celery._gate import RunGate, find_gate, gate_of
from beatless.celery._schedule import (
    CeleryScheduler,
    build_scheduler,
    check_app,
    unregistered_tasks,
)
from beatless.celery._settings import CONSUME_WITH, CelerySettings, on_schedule_error_of
from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import ConfigError, ScheduleError, StoreError
from beatless.ops import metrics
from beatless.schedule.problems import (
    EXIT_REFUSED,
    REFUSE,
    one_line,
    refusal,
    report_consuming,
    report_left_out,
    report_store_consuming,
    store_refusal,
    to_run,
)

logger = logging.getLogger(__name__)

DISABLE_OPTION = "--without-beatless"
STOP_TIMEOUT = 5.0
"""Seconds a warm shutdown waits for the wake in progress to end."""
DJANGO_BRIDGE = "beatless.django:start_bridge"
"""What ``beatless_django = True`` starts beside the scheduler, loaded by name as Celery
loads a ``beat_scheduler``: the bridge is built on this package, not the other way."""


class StartRefused(WorkerShutdown):  # type: ignore[misc]
    """This node refuses to start: :attr:`reason` says why, in the words logged, and
    :attr:`problems` lists each problem on its own. A ``SystemExit`` raised by a
    bootstep's ``start`` is Celery's clean stop: the worker shuts down with
    :data:`~beatless.schedule.problems.EXIT_REFUSED` and no traceback (any other exception is an
    "Unrecoverable error" printed with its traceback)."""

    def __init__(self, reason: str, problems: Sequence[str]) -> None:
        super().__init__(EXIT_REFUSED)
        self.reason = reason
        self.problems = tuple(problems)


def _refuse(reason: str, problems: Sequence[str]) -> NoReturn:
    """Say why at CRITICAL, once, then stop the worker cleanly."""
    logger.critical("%s", reason)
    raise StartRefused(reason, problems)


class BeatlessStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs the beatless scheduler of this worker node in its main process."""

    label = "Beatless"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, without_beatless: bool = False, **kwargs: Any) -> None:
        self.enabled = not without_beatless
        self.scheduler: CeleryScheduler | None = None
        self.bridge: Any = None
        """The django-celery-beat bridge's poll duty (``beatless_django``), else ``None``."""
        self.schedule_problems: tuple[str, ...] = ()
        """The problems of this node's schedule (``"consume"`` only): what keeps it from
        scheduling, or the entries it leaves out; empty otherwise."""
        self.runs: RunGate | None = find_gate(getattr(worker, "app", None))
        """The run checks of this worker (``None`` without :func:`install`): its
        :meth:`~beatless.celery._gate.RunGate.counts` are those of the main process, where
        the threads and solo pools run tasks; each prefork child logs its own as it ends."""
        super().__init__(worker, **kwargs)

    def include_if(self, worker: Any) -> bool:
        if not self.enabled:
            logger.info("beatless is off on this node (%s)", DISABLE_OPTION)
        return self.enabled

    def create(self, worker: Any) -> BeatlessStep:
        return self

    def start(self, worker: Any) -> None:
        """Check the schedule, open and probe the claim store, then start the scheduler.
        A node that refuses raises :class:`StartRefused`: Celery stops the worker with
        :data:`~beatless.schedule.problems.EXIT_REFUSED`, before it consumes anything."""
        if self.scheduler is not None or self.schedule_problems:
            return
        app = worker.app
        mode = on_schedule_error_of(app)
        found = check_app(app)
        schedule = to_run(found, mode)
        if schedule is not None and found.problems:  # "consume": the others left out
            self.schedule_problems = found.problems
            report_left_out(logger, found, consume_with=CONSUME_WITH)
        if schedule is None:
            self._schedule_problems(mode, found.problems)
            return
        for warning in unregistered_tasks(app, schedule):
            logger.warning("beatless: %s", shown(warning, quoted=False, limit=ERROR_LIMIT))
        node = f"{worker.hostname}:{os.getpid()}"
        try:
            settings = CelerySettings.from_app(app)
            self.scheduler = build_scheduler(app, node=node, settings=settings, schedule=schedule)
            self.scheduler.board.leave_out(found.left_out)
        except ScheduleError as exc:  # what the claim store refuses, known once it is open
            self._schedule_problems(mode, exc.errors)
            return
        except ConfigError as exc:  # a store URL or option the store refuses
            self._schedule_problems(mode, [one_line(str(exc))])
            return
        except StoreError as exc:  # unreachable, or refusing the credentials
            if mode == REFUSE:
                _refuse(store_refusal(exc, consume_with=CONSUME_WITH), [one_line(str(exc))])
            self.schedule_problems = (one_line(str(exc)),)
            report_store_consuming(logger, exc, consume_with=CONSUME_WITH)
            return
        self.scheduler.start()
        publish_metrics(self.scheduler, settings)
        try:
            self.bridge = start_bridge(app, self.scheduler, settings)
        except ConfigError as exc:
            self.stop(worker)
            self._schedule_problems(mode, [one_line(str(exc))])

    def _schedule_problems(self, mode: str, problems: Sequence[str]) -> None:
        """Refuse to start with ``problems``, or (``"consume"``) keep them and say so once."""
        if mode == REFUSE:
            _refuse(str(refusal(problems, consume_with=CONSUME_WITH)), problems)
        self.schedule_problems = tuple(problems)
        report_consuming(logger, problems, consume_with=CONSUME_WITH)

    def stop(self, worker: Any) -> None:
        bridge, self.bridge = self.bridge, None
        if bridge is not None:
            bridge.stop(STOP_TIMEOUT)
        scheduler, self.scheduler = self.scheduler, None
        if scheduler is not None:
            metrics.unregister(scheduler)
            scheduler.close(STOP_TIMEOUT)

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)

    def terminate(self, worker: Any) -> None:
        self.stop(worker)


def start_bridge(app: Any, scheduler: CeleryScheduler, settings: CelerySettings) -> Any:
    """The django-celery-beat bridge of this node, started, when ``beatless_django`` is
    on (:mod:`beatless.django`); ``None`` when it is off."""
    value = app.conf.get("beatless_django")
    if value is None or value is False:
        return None
    if value is not True:
        raise ConfigError(f"beatless_django must be True or False, got {value!r}")
    return symbol_by_name(DJANGO_BRIDGE)(app, scheduler, settings)


def publish_metrics(scheduler: CeleryScheduler, settings: CelerySettings) -> None:
    """Export the node's metrics as the settings ask: into ``beatless_metrics_registry``
    (or prometheus_client's default registry), served on ``beatless_metrics_port`` (at
    ``beatless_metrics_host``) once per process."""
    if settings.metrics_port is not None or settings.metrics_registry is not None:
        metrics.publish(
            scheduler,
            port=settings.metrics_port,
            registry=settings.metrics_registry,
            addr=settings.metrics_host,
        )


def install(app: Any) -> None:
    """Run a beatless scheduler in every worker of ``app``; ``--without-beatless`` opts a
    node out. Every worker of ``app`` also checks each beatless firing's task as it starts
    (:mod:`beatless.celery._gate`), whether it schedules or not. Call it where the app is
    defined, before the worker command line is read."""
    gate_of(app)
    steps = app.steps["worker"]
    if BeatlessStep not in steps:
        steps.add(BeatlessStep)
    options = app.user_options["worker"]
    if not any(DISABLE_OPTION in getattr(option, "opts", ()) for option in options):
        options.add(
            click.Option(
                [DISABLE_OPTION],
                is_flag=True,
                default=False,
                help="Do not run the beatless scheduler on this node.",
            )
        )
