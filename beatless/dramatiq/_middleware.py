"""The ``Beatless`` middleware: one scheduler per node, no scheduler process to run.

Under the ``dramatiq`` CLI the scheduler runs in the middleware's fork (see
:mod:`beatless.dramatiq._fork`); with a :class:`dramatiq.Worker` started in your own
process it runs in a thread started and stopped with the worker. Never both: the CLI's
worker processes emit ``after_process_boot``, and from then on the thread is not started.

Every worker process checks the whole schedule before it consumes (``before_worker_boot``)
and collects every problem (:mod:`beatless.schedule.problems`), then opens the claim store and
probes it. By default a schedule with problems, or a store that cannot be reached or
refuses the credentials, stops the worker: said once at CRITICAL (for the store, one line
naming it, its URL masked), then :class:`ScheduleRefused` ends ``Worker.start``, and a
worker process of the ``dramatiq`` command exits with
:data:`~beatless.schedule.problems.EXIT_REFUSED` and no traceback, so the command exits non-zero.
With ``on_schedule_error="consume"`` the workers consume; when each problem is one
entry's, the node schedules the other entries and names each one left out in a WARNING
and in its registry record (as the Celery side does, through the same
:func:`~beatless.schedule.problems.to_run`); otherwise it schedules nothing and says so
once at ERROR. The problems are in :attr:`Beatless.schedule_problems`.

Every worker thread checks a beatless message before its actor's body
(``before_process_message``) against the run policy it carries, and ends the run when the
message is processed or skipped: :mod:`beatless.dramatiq._gate`.

The middleware composes the parts, as the Celery side does: its options
(:mod:`beatless.dramatiq._settings`), the run checks (:mod:`beatless.dramatiq._gate`), the
schedule and the scheduler built over it (:mod:`beatless.dramatiq._schedule`), and the claim
store, given or following the broker (:mod:`beatless.dramatiq._store`); it keeps the hooks
and the start-up refusal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from dramatiq import Middleware
from dramatiq.middleware import MiddlewareError

from beatless.core.durations import DurationLike
from beatless.core.urls import mask_url
from beatless.dramatiq import _schedule as schedules
from beatless.dramatiq._fork import run_scheduler
from beatless.dramatiq._gate import RunGate
from beatless.dramatiq._periodic import OPTION
from beatless.dramatiq._schedule import SchedulerBuilder
from beatless.dramatiq._settings import CONSUME_WITH, DramatiqSettings
from beatless.dramatiq._store import runs_store, store_problems
from beatless.errors import ScheduleError, StoreError
from beatless.node.dispatch import DEFAULT_LEASE
from beatless.node.runs import DEFAULT_CHECK_WAIT
from beatless.node.scheduler import Scheduler
from beatless.ops import metrics as exported
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.options import (
    DEFAULT_CATCH_UP,
    DEFAULT_HEARTBEAT,
    DEFAULT_OVERLAP,
    DEFAULT_RUN_LEASE,
)
from beatless.schedule.problems import (
    EXIT_REFUSED,
    REFUSE,
    Checked,
    one_line,
    refusal,
    report_consuming,
    report_left_out,
    report_store_consuming,
    store_refusal,
    to_run,
)
from beatless.stores.base import ClaimStore

if TYPE_CHECKING:
    from dramatiq import Broker, Worker
    from dramatiq.broker import MessageProxy

    from beatless.ops.metrics import CollectorRegistry

logger = logging.getLogger(__name__)

OPTIONS = frozenset(DramatiqSettings.__dataclass_fields__)
"""The options of the constructor, each readable as an attribute of the middleware."""


class ScheduleRefused(ScheduleError, MiddlewareError):
    """The node refuses to start: its schedule has problems, or its claim store cannot be
    used. A middleware error, so that Dramatiq lets it end ``Worker.start`` instead of
    logging it and going on. (A worker process of the ``dramatiq`` command ends with
    :data:`~beatless.schedule.problems.EXIT_REFUSED` instead, so that the reason is not printed
    again inside a traceback.)"""


class Beatless(Middleware):
    """Periodic tasks for a Dramatiq broker: ``broker.add_middleware(Beatless(store=...))``.

    ``store`` is a claim-store URL (``redis://``, ``postgresql://``, ``nats://``,
    ``amqp://``, ``sqlite:///``, ``memory://``), a
    :class:`~beatless.stores.base.ClaimStore`, or a ``redis.Redis`` client; left out, it
    follows the broker: a ``RedisBroker``'s own Redis, a ``RabbitmqBroker``'s own
    RabbitMQ (the RabbitMQ store), so no other server is needed. When it is the Redis of a
    ``RedisBroker`` (same server and database), claim and enqueue are one script;
    otherwise a firing is claimed, enqueued with ``broker.enqueue`` and committed.

    ``namespace`` is the first part of every address, so it keeps two apps on one claim
    store apart: give each app its own, the same on every node of the app. Nothing a
    middleware can see tells apps apart reliably (two apps may share a Redis broker's
    namespace, and one app's nodes may name their servers differently), so a store other
    than the memory store (one process) needs it: without it the node does not start.

    ``entries`` are :class:`~beatless.Entry` values whose ``task`` is an actor name;
    actors declared with the ``periodic`` option are added to them when the scheduler
    starts. ``jitter``, ``max_late``, ``catch_up``, ``overlap``, ``run_lease``,
    ``heartbeat`` and ``once_only`` are the defaults of those declarations (an
    :class:`~beatless.Entry` given in ``entries`` has its own).
    ``tenant_kwarg`` is the keyword argument a fan-out firing passes its tenant in
    (``None``: only in the message options). ``on_schedule_error`` is ``"refuse"`` (a
    schedule with problems stops the worker) or ``"consume"`` (the worker consumes and
    the node schedules the entries without a problem of their own, or nothing when a
    problem is the whole schedule's; see :attr:`schedule_problems`).

    ``metrics`` registers the node's scheduler, where it runs, in prometheus_client's
    default registry (``True``) or the ``CollectorRegistry`` given (:mod:`beatless.ops.metrics`);
    ``metrics_port`` serves that registry on a port of its own from that process, and
    turns the metrics on. Under the ``dramatiq`` CLI the scheduler runs in a process of
    its own, whose metrics Dramatiq's ``Prometheus`` middleware cannot show (it exposes
    what its worker processes write to its multiprocess directory): give
    ``metrics_port`` and scrape it beside Dramatiq's port. ``metrics_host`` is the address
    that port listens on: ``127.0.0.1`` (this host only) unless given, ``0.0.0.0`` for a
    Prometheus on another host.

    ``check_wait`` (30 s unless given): how long a worker's check of a firing (once-only,
    overlap ``skip``) waits for a claim store it cannot reach, trying again every 0.5 s,
    before it gives the check up: the message then runs ``unchecked``, or is skipped under
    ``skip``. ``0`` gives it up at the first failure.

    ``preferred_claimer`` (default on): each firing is claimed first by one node of the
    live registry, chosen by rendezvous hashing on its id, the others claiming only if it
    did not (:mod:`beatless.node._prefer`); off, every node claims every firing.

    ``live`` (default on): the node also schedules the live entries of its namespace,
    written at run time (``docs/live.md``); off, only the code's. On a store that cannot
    keep them (RabbitMQ) it is off, said once at INFO.
    """

    def __init__(
        self,
        *,
        store: Any = None,
        entries: Iterable[Entry] = (),
        namespace: str | None = None,
        timezone: str = "UTC",
        jitter: DurationLike = 0,
        max_late: DurationLike | None = None,
        catch_up: str = DEFAULT_CATCH_UP,
        overlap: str = DEFAULT_OVERLAP,
        run_lease: DurationLike = DEFAULT_RUN_LEASE,
        heartbeat: DurationLike = DEFAULT_HEARTBEAT,
        once_only: bool = True,
        check_wait: DurationLike = DEFAULT_CHECK_WAIT,
        lease: DurationLike = DEFAULT_LEASE,
        tenant_kwarg: str | None = "tenant",
        on_schedule_error: str = REFUSE,
        node: str | None = None,
        clock: Callable[[], float] = time.time,
        metrics: bool | CollectorRegistry = False,
        metrics_port: int | None = None,
        metrics_host: str = exported.DEFAULT_ADDR,
        preferred_claimer: bool = True,
        live: bool = True,
    ) -> None:
        self.settings = DramatiqSettings.of(
            store=store,
            entries=entries,
            namespace=namespace,
            timezone=timezone,
            jitter=jitter,
            max_late=max_late,
            catch_up=catch_up,
            overlap=overlap,
            run_lease=run_lease,
            heartbeat=heartbeat,
            once_only=once_only,
            check_wait=check_wait,
            lease=lease,
            tenant_kwarg=tenant_kwarg,
            on_schedule_error=on_schedule_error,
            node=node,
            clock=clock,
            metrics=metrics,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            preferred_claimer=preferred_claimer,
            live=live,
        )
        """The options, converted and checked (:mod:`beatless.dramatiq._settings`); each
        is also an attribute of the middleware (``beat.jitter``)."""
        self.gate = RunGate(self.settings, self.status_store)
        """The run checks of the worker process (:mod:`beatless.dramatiq._gate`)."""
        self.builder = SchedulerBuilder(self.settings)
        """What makes the node's scheduler and closes what it opened."""
        self.schedule_problems: tuple[str, ...] = ()
        """The problems of this node's schedule (``"consume"`` only): what keeps it from
        scheduling, or the entries it leaves out; empty otherwise."""
        self.left_out: tuple[str, ...] = ()
        """The entries this node leaves out for a problem of their own (``"consume"``)."""
        self._under_cli = False
        self._reported = False
        self._scheduler: Scheduler | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        store, namespace = self.settings.store, self.settings.namespace
        where = mask_url(store) if isinstance(store, str) else repr(store)
        return f"Beatless(store={where!r}, namespace={namespace!r})"

    def __getattr__(self, name: str) -> Any:
        # The options as attributes, as they were before they had an object of their own.
        if name in OPTIONS and "settings" in self.__dict__:
            return getattr(self.__dict__["settings"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- Dramatiq's middleware surface ---------------------------------------------------

    @property
    def actor_options(self) -> set[str]:
        return {OPTION}

    @property
    def forks(self) -> list[Callable[[], int]]:
        return [run_scheduler]

    def after_process_boot(self, broker: Broker) -> None:
        # Only the dramatiq CLI's worker processes emit this: the fork runs the scheduler.
        self._under_cli = True

    def before_worker_boot(self, broker: Broker, worker: Worker) -> None:
        # Under the CLI the fork's scheduler process says it once, not every worker; the
        # workers probe the store only to refuse (they consume whatever it answers).
        under_cli = self._under_cli
        refuses = self.settings.on_schedule_error == REFUSE
        self.checked_at_start(broker, report=not under_cli, probe=not under_cli or refuses)

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        if self._under_cli or (self.schedule_problems and not self.left_out):
            return
        self.start(broker)

    def before_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        self.stop()

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        # Every worker thread has ended its message: no run of this process is left.
        self.gate.close()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        """Check the run of a beatless firing before its actor's body
        (:meth:`RunGate.check <beatless.dramatiq._gate.RunGate.check>`): a refused run
        raises :class:`~dramatiq.middleware.SkipMessage`."""
        self.gate.check(broker, message)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self.gate.end(message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        # Skipped by a middleware after this one, once its run had started: end it too.
        self.gate.end(message)

    # -- the worker's runs ---------------------------------------------------------------

    @property
    def run_counts(self) -> dict[str, int]:
        """The verdicts of this process's runs so far: ``run``, ``rerun``, ``unchecked``
        (proceeded), ``duplicate``, ``skipped_overlap`` (refused), ``lease_lost`` (a run
        that went on after its records lapsed), ``waited`` (checks that waited for the
        store), ``recorded_late``, ``ran_twice``, ``unrecorded`` (what became of the
        unchecked runs, see :mod:`beatless.node.runs`) and ``committed_late``,
        ``uncommitted`` (runs that ended while the store could not be reached)."""
        return self.gate.counts

    def status_store(self, broker: Broker) -> ClaimStore:
        """The claim store the nodes of ``broker`` keep their registry and history in (and
        the runs of this process), for ``beatless status --dramatiq``; close it when done."""
        scheduler = self._scheduler
        return runs_store(self.settings, broker, scheduler.store if scheduler else None)

    # -- the schedule --------------------------------------------------------------------

    @property
    def address_namespace(self) -> str:
        """The namespace of every address: ``namespace``, or ``"default"`` on the memory
        store; a :class:`~beatless.errors.ConfigError` for a shared store without one."""
        return self.settings.address_namespace

    def check(self, broker: Broker) -> Checked:
        """Every problem of the node's schedule at once, each naming its entry: what the
        node refuses to start with, and what ``beatless check --dramatiq`` reports.
        Connects to nothing."""
        return schedules.check(self.settings, broker)

    def schedule(self, broker: Broker) -> Schedule:
        """The node's schedule: ``entries`` and the broker's periodic actors, checked; a
        :class:`~beatless.errors.ScheduleError` lists every problem."""
        found = self.check(broker)
        if found.schedule is None:
            raise ScheduleError("; ".join(found.problems), list(found.problems))
        return found.schedule

    def checked_at_start(
        self, broker: Broker, *, report: bool = True, probe: bool = True
    ) -> Schedule | None:
        """The schedule when it is sound and (with ``probe``) the claim store answers,
        accepts the credentials and remembers long enough (rule 5). Otherwise the node
        refuses to start, said at CRITICAL (:class:`ScheduleRefused`; the ``dramatiq``
        command's worker processes exit), or, with ``on_schedule_error="consume"``: when
        each problem is one entry's, the schedule of the others (each entry left out said
        once at WARNING if ``report``, and named in the node's registry record); else
        ``None``, said once at ERROR if ``report``. Either way the problems go to
        :attr:`schedule_problems`."""
        found = self.check(broker)
        schedule = to_run(found, self.settings.on_schedule_error)
        problems = list(found.problems)
        unusable: StoreError | None = None
        if schedule is not None and probe:
            scheduler = self._scheduler
            try:
                problems += store_problems(
                    self.settings, broker, schedule, scheduler.store if scheduler else None
                )
            except StoreError as exc:
                unusable = exc
        if schedule is not None and len(problems) == len(found.problems) and unusable is None:
            self.schedule_problems, self.left_out = found.problems, found.left_out
            if report and not self._reported and found.left_out:
                self._reported = True
                report_left_out(logger, found, consume_with=CONSUME_WITH)
            return schedule
        if unusable is not None:
            problems = [one_line(str(unusable))]
        if self.settings.on_schedule_error == REFUSE:
            reason = (
                str(refusal(problems, consume_with=CONSUME_WITH))
                if unusable is None
                else store_refusal(unusable, consume_with=CONSUME_WITH)
            )
            _refuse(reason, problems, under_cli=self._under_cli)
        self.schedule_problems = tuple(problems)
        if report and not self._reported:
            self._reported = True
            if unusable is None:
                report_consuming(logger, problems, consume_with=CONSUME_WITH)
            else:
                report_store_consuming(logger, unusable, consume_with=CONSUME_WITH)
        return None

    # -- running -------------------------------------------------------------------------

    def scheduler(self, broker: Broker, schedule: Schedule | None = None) -> Scheduler:
        """A scheduler for this node over ``broker`` (not started); it is closed with
        :meth:`close`. ``schedule`` defaults to :meth:`schedule`."""
        return self.builder.scheduler(broker, schedule or self.schedule(broker))

    def start(self, broker: Broker) -> Scheduler | None:
        """Start the scheduler thread of this process (once), after
        :meth:`checked_at_start`: ``None`` when the node consumes without scheduling."""
        with self._lock:
            if self._scheduler is None:
                schedule = self.checked_at_start(broker)
                if schedule is None:
                    return None
                self._scheduler = self.scheduler(broker, schedule)
                self._scheduler.board.leave_out(self.left_out)
                self._scheduler.start()
                _publish_metrics(self.settings, self._scheduler)
            return self._scheduler

    def stop(self, timeout: float | None = 10) -> None:
        """Stop the scheduler thread, if this process runs one, and close the store."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            exported.unregister(scheduler)
            scheduler.stop(timeout)
        self.close()

    def close(self) -> None:
        """Close the stores and the broker connections the middleware opened itself."""
        self.builder.close()


def _refuse(reason: str, problems: list[str], *, under_cli: bool) -> NoReturn:
    """Say why at CRITICAL, then stop this worker: a worker process of the ``dramatiq``
    command exits quietly (Dramatiq's multiprocessing prints any other exception with its
    traceback), an embedded ``Worker.start`` raises."""
    logger.critical("%s", reason)
    if under_cli:
        raise SystemExit(EXIT_REFUSED)
    raise ScheduleRefused(reason, problems)


def _publish_metrics(settings: DramatiqSettings, scheduler: Scheduler) -> None:
    if settings.metrics is False and settings.metrics_port is None:
        return
    registry = None if isinstance(settings.metrics, bool) else settings.metrics
    exported.publish(
        scheduler, port=settings.metrics_port, registry=registry, addr=settings.metrics_host
    )


def find(broker: Broker) -> Sequence[Beatless]:
    """The ``Beatless`` middleware added to ``broker``."""
    return [m for m in broker.middleware if isinstance(m, Beatless)]
