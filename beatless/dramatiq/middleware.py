"""The ``Beatless`` middleware: one scheduler per node, no scheduler process to run.

Under the ``dramatiq`` CLI the scheduler runs in the middleware's fork (see
:mod:`beatless.dramatiq.fork`); with a :class:`dramatiq.Worker` started in your own
process it runs in a thread started and stopped with the worker. Never both: the CLI's
worker processes emit ``after_process_boot``, and from then on the thread is not started.

Every worker process checks the whole schedule before it consumes (``before_worker_boot``)
and collects every problem (:mod:`beatless.schedule.problems`), then opens the claim store and
probes it. By default a schedule with problems, or a store that cannot be reached or
refuses the credentials, stops the worker: said once at CRITICAL (for the store, one line
naming it, its URL masked), then :class:`ScheduleRefused` ends ``Worker.start``, and a
worker process of the ``dramatiq`` command exits with
:data:`~beatless.schedule.problems.EXIT_REFUSED` and no traceback, so the command exits non-zero.
With ``on_schedule_error="consume"`` the workers consume, the node schedules nothing, says
so once at ERROR, and the problems are in :attr:`Beatless.schedule_problems`.

Every worker thread checks a beatless message before its actor's body
(``before_process_message``): the run policy the message carries
(:data:`~beatless.node.runs.RUN_HEADER`) is checked with :class:`~beatless.node.runs.Runs` on the
claim store the scheduler uses, opened once per worker process (the CLI's worker
processes are forks), and a refused run raises :class:`~dramatiq.middleware.SkipMessage`.
A run that proceeds is ended when the message is processed or skipped, whatever the
result (``after_process_message``, ``after_skip_message``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, cast
from urllib.parse import quote, urlsplit

from dramatiq import Middleware, get_encoder
from dramatiq.middleware import MiddlewareError, SkipMessage

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import DurationLike, as_timedelta, to_ms
from beatless.core.triggers import zone
from beatless.core.urls import mask_url
from beatless.dramatiq.fork import run_scheduler
from beatless.dramatiq.messages import ADDRESS_OPTION, ENTRY_OPTION, TENANT_OPTION, message_for
from beatless.dramatiq.periodic import OPTION, declarations
from beatless.dramatiq.sending import Sender, is_broker
from beatless.errors import ConfigError, ScheduleError, StoreError
from beatless.fleet.limits import checked
from beatless.node.dispatch import DEFAULT_LEASE, Dispatcher
from beatless.node.runs import RUN_HEADER, Run, RunPolicy, Runs
from beatless.node.scheduler import Scheduler, send_deadline_s
from beatless.ops import metrics as exported
from beatless.schedule.entry import Entry, Schedule, address_segment, tenant_address
from beatless.schedule.firing import Firing
from beatless.schedule.options import (
    DEFAULT_CATCH_UP,
    DEFAULT_HEARTBEAT,
    DEFAULT_MAX_LATE,
    DEFAULT_OVERLAP,
    DEFAULT_RUN_LEASE,
    catch_up_policy,
    overlap_policy,
)
from beatless.schedule.problems import (
    EXIT_REFUSED,
    REFUSE,
    Checked,
    argument_problems,
    collect,
    on_schedule_error,
    one_line,
    refusal,
    report_consuming,
    report_store_consuming,
    store_refusal,
)
from beatless.stores import missing_driver, open_store, probed
from beatless.stores.base import ClaimRequest, ClaimStore, Note, Outcome
from beatless.stores.memory import MemoryStore

if TYPE_CHECKING:
    from dramatiq import Actor, Broker, Worker
    from dramatiq.broker import MessageProxy
    from dramatiq.brokers.redis import RedisBroker

    from beatless.ops.metrics import CollectorRegistry

logger = logging.getLogger(__name__)

MEMORY_NAMESPACE = "default"
"""The namespace of a middleware on the memory store (one process) that names none."""
CONSUME_WITH = 'Beatless(..., on_schedule_error="consume")'


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
    the node schedules nothing; see :attr:`schedule_problems`).

    ``metrics`` registers the node's scheduler, where it runs, in prometheus_client's
    default registry (``True``) or the ``CollectorRegistry`` given (:mod:`beatless.ops.metrics`);
    ``metrics_port`` serves that registry on a port of its own from that process, and
    turns the metrics on. Under the ``dramatiq`` CLI the scheduler runs in a process of
    its own, whose metrics Dramatiq's ``Prometheus`` middleware cannot show (it exposes
    what its worker processes write to its multiprocess directory): give
    ``metrics_port`` and scrape it beside Dramatiq's port. ``metrics_host`` is the address
    that port listens on: ``127.0.0.1`` (this host only) unless given, ``0.0.0.0`` for a
    Prometheus on another host.

    ``preferred_claimer`` (default on): each firing is claimed first by one node of the
    live registry, chosen by rendezvous hashing on its id, the others claiming only if it
    did not (:mod:`beatless.node._prefer`); off, every node claims every firing.
    """

    def __init__(
        self,
        *,
        store: Any = None,
        entries: Iterable[Entry] = (),
        namespace: str | None = None,
        timezone: str = "UTC",
        jitter: DurationLike = 0,
        max_late: DurationLike = DEFAULT_MAX_LATE,
        catch_up: str = DEFAULT_CATCH_UP,
        overlap: str = DEFAULT_OVERLAP,
        run_lease: DurationLike = DEFAULT_RUN_LEASE,
        heartbeat: DurationLike = DEFAULT_HEARTBEAT,
        once_only: bool = True,
        lease: DurationLike = DEFAULT_LEASE,
        tenant_kwarg: str | None = "tenant",
        on_schedule_error: str = REFUSE,
        node: str | None = None,
        clock: Callable[[], float] = time.time,
        metrics: bool | CollectorRegistry = False,
        metrics_port: int | None = None,
        metrics_host: str = exported.DEFAULT_ADDR,
        preferred_claimer: bool = True,
    ) -> None:
        self.store = store
        self.entries = tuple(entries)
        for entry in self.entries:
            if not isinstance(entry, Entry):
                raise ConfigError(f"Beatless entries must be Entry values, got {entry!r}")
        if namespace is not None and (
            not isinstance(namespace, str) or not namespace.strip() or "/" in namespace
        ):
            raise ConfigError(f"Beatless: namespace must be a name without '/', got {namespace!r}")
        self.namespace = namespace
        zone(timezone)
        self.timezone = timezone
        self.jitter = as_timedelta(jitter, name="Beatless: jitter")
        self.max_late = as_timedelta(max_late, name="Beatless: max_late")
        self.catch_up = catch_up_policy(catch_up, "Beatless")
        self.overlap = overlap_policy(overlap, "Beatless")
        self.run_lease = as_timedelta(run_lease, name="Beatless: run_lease")
        self.heartbeat = as_timedelta(heartbeat, name="Beatless: heartbeat")
        if not isinstance(once_only, bool):
            raise ConfigError(f"Beatless: once_only must be true or false, got {once_only!r}")
        self.once_only = once_only
        self.lease = as_timedelta(lease, name="Beatless: lease")
        self.tenant_kwarg = tenant_kwarg
        self.on_schedule_error = _on_schedule_error(on_schedule_error)
        self.node = node
        self.clock = clock
        if metrics is True:
            exported.require()
        elif metrics is not False:
            metrics = exported.metrics_registry(metrics, "Beatless: metrics")
        self.metrics = metrics
        self.metrics_port = (
            None
            if metrics_port is None
            else exported.metrics_port(metrics_port, "Beatless: metrics_port")
        )
        self.metrics_host = exported.metrics_host(metrics_host, "Beatless: metrics_host")
        if not isinstance(preferred_claimer, bool):
            raise ConfigError(
                f"Beatless: preferred_claimer must be true or false, got {preferred_claimer!r}"
            )
        self.preferred_claimer = preferred_claimer
        self.schedule_problems: tuple[str, ...] = ()
        """What keeps this node from scheduling (``"consume"`` only); empty otherwise."""
        self._under_cli = False
        self._reported = False
        self._scheduler: Scheduler | None = None
        self._opened: list[Any] = []
        self._lock = threading.Lock()
        self._runs: Runs | None = None
        self._runs_pid = 0
        self._runs_closed = False
        self._running: dict[int, tuple[MessageProxy, Runs, Run]] = {}
        """The runs that proceeded, by the message proxy being processed (two copies of
        one message, same id, may be processed at once in one process)."""
        self._running_lock = threading.Lock()

    def __repr__(self) -> str:
        where = mask_url(self.store) if isinstance(self.store, str) else repr(self.store)
        return f"Beatless(store={where!r}, namespace={self.namespace!r})"

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
        self.checked_at_start(
            broker, report=not under_cli, probe=not under_cli or self.on_schedule_error == REFUSE
        )

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        if self._under_cli or self.schedule_problems:
            return
        self.start(broker)

    def before_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        self.stop()

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        # Every worker thread has ended its message: no run of this process is left.
        self.close_runs()

    # -- the worker's side of a firing: overlap and once-only ------------------------------

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        """Check the run of a beatless firing before its actor's body.

        A message that carries a run policy (:data:`~beatless.node.runs.RUN_HEADER`) with
        anything to check is started with :meth:`Runs.start <beatless.node.runs.Runs.start>`
        (the attempt is the ``retries`` option of Dramatiq's ``Retries`` middleware); a
        refused run (``duplicate``, ``skipped_overlap``; counted and logged by
        :class:`~beatless.node.runs.Runs`) raises :class:`~dramatiq.middleware.SkipMessage`, so
        the message is acknowledged without running. Any other message passes."""
        policy = RunPolicy.decode(message.options.get(RUN_HEADER))
        if policy is None or not policy.guarded:
            return
        address = self._address_of(message)
        if address is None:
            logger.warning(
                "beatless: message %s carries a run policy but no address; run unchecked",
                shown(message.message_id),
            )
            return
        runs = self.runs(broker)
        run = runs.start(message.message_id, address, policy, _attempt(message))
        if not run.proceed:
            raise SkipMessage(f"beatless: firing {message.message_id} not run: {run.verdict}")
        with self._running_lock:
            self._running[id(message)] = (message, runs, run)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._end_run(message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        # Skipped by a middleware after this one, once its run had started: end it too.
        self._end_run(message)

    def _end_run(self, message: MessageProxy) -> None:
        with self._running_lock:
            found = self._running.pop(id(message), None)
        if found is not None:
            _, runs, run = found
            runs.end(run)

    def runs(self, broker: Broker) -> Runs:
        """The run checks of this process, on the claim store the scheduler uses (opened
        on first use, again in a forked process, and again after :meth:`close_runs`).
        Its node name is ``host:pid``."""
        pid = os.getpid()
        with self._running_lock:
            runs = self._runs
            if runs is None or self._runs_pid != pid or self._runs_closed:
                node = f"{self.node or socket.gethostname()}:{pid}"
                fresh = Runs(partial(self._runs_store, broker), node, clock=self.clock)
                if runs is not None and self._runs_pid == pid:
                    fresh.counts = runs.counts  # the process's counts go on
                else:
                    self._running = {}
                self._runs, self._runs_pid, self._runs_closed = fresh, pid, False
                runs = fresh
            return runs

    @property
    def run_counts(self) -> dict[str, int]:
        """The verdicts of this process's runs so far: ``run``, ``rerun``, ``unchecked``
        (proceeded), ``duplicate``, ``skipped_overlap`` (refused), ``lease_lost`` (a run
        that went on after its records lapsed), and ``recorded_late``, ``ran_twice``,
        ``unrecorded`` (what became of the unchecked runs, see :mod:`beatless.node.runs`)."""
        runs = self._runs
        if runs is None or self._runs_pid != os.getpid():
            return {}
        return dict(runs.counts)

    def close_runs(self) -> None:
        """Stop this process's heartbeat thread and close the store of its runs (the
        counts are kept)."""
        with self._running_lock:
            runs, closed = self._runs, self._runs_closed
            self._runs_closed = True
            mine = self._runs_pid == os.getpid()
        if runs is not None and mine and not closed:
            if runs.counts:
                said = ", ".join(f"{k}={v}" for k, v in sorted(runs.counts.items()))
                logger.info(
                    "beatless runs of node %s: %s",
                    shown(runs.node, quoted=False),
                    shown(said, quoted=False, limit=ERROR_LIMIT),
                )
            runs.close()

    def status_store(self, broker: Broker) -> ClaimStore:
        """The claim store the nodes of ``broker`` keep their registry and history in, for
        ``beatless status --dramatiq``; close it when done."""
        return self._runs_store(broker)

    def _runs_store(self, broker: Broker) -> ClaimStore:
        """The claim store of this process's runs: the one the scheduler claims in."""
        store = self.store
        if isinstance(store, Dispatcher):
            store = store.store
        if isinstance(store, ClaimStore):
            return _Borrowed(store)
        scheduler = self._scheduler
        if _is_memory(store) and scheduler is not None:
            return _Borrowed(scheduler.store)  # one process: the scheduler's own memory
        namespace = self.address_namespace
        if store is None and is_broker(broker, "dramatiq.brokers.redis", "RedisBroker"):
            from beatless.stores.redis.store import RedisStore

            return RedisStore(cast("RedisBroker", broker).client, namespace=namespace)
        if store is None:
            store = _broker_store_url(broker)
        if isinstance(store, str):
            return open_store(store, namespace=namespace)
        if _is_redis_client(store):
            from beatless.stores.redis.store import RedisStore

            return RedisStore(store, namespace=namespace)
        raise ConfigError(
            f"Beatless: store must be a URL, a ClaimStore or a redis client, got {store!r}"
        )

    def _address_of(self, message: MessageProxy) -> str | None:
        """The message's address option; for a message without one, the address its
        entry and tenant options make in this middleware's namespace."""
        options = message.options
        address = options.get(ADDRESS_OPTION)
        if isinstance(address, str) and address:
            return address
        entry = options.get(ENTRY_OPTION)
        if not isinstance(entry, str) or not entry:
            return None
        base = f"{self.address_namespace}/{address_segment(entry)}"
        tenant = options.get(TENANT_OPTION)
        return base if tenant is None else tenant_address(base, str(tenant))

    # -- the schedule --------------------------------------------------------------------

    @property
    def address_namespace(self) -> str:
        """The namespace of every address: ``namespace``, or ``"default"`` on the memory
        store; a :class:`~beatless.errors.ConfigError` for a shared store without one."""
        if self.namespace is not None:
            return self.namespace
        if _is_memory(self.store):
            return MEMORY_NAMESPACE
        where = _where(self.store)
        raise ConfigError(
            f"Beatless: namespace is required with the claim store {where}: two apps on one "
            f"store with the same entry names would claim each other's firings; give "
            f'Beatless(namespace="myapp"), the same on every node of this app (nodes that '
            f'ran without one used "default": give namespace="default" to keep their ids)'
        )

    def check(self, broker: Broker) -> Checked:
        """Every problem of the node's schedule at once, each naming its entry: what the
        node refuses to start with, and what ``beatless check --dramatiq`` reports.
        Connects to nothing."""
        problems: list[str] = []
        namespace = collect(lambda: self.address_namespace, problems)
        found = list(self.entries)
        for declaring in list(broker.actors.values()):
            value = declaring.options.get(OPTION)
            if value is not None:
                found += self._declared(declaring, value, problems)
        for entry in found:
            actor = collect(partial(_actor, broker, entry.task, entry.name), problems)
            if actor is not None:
                problems += self._message_problems(entry, actor, namespace or MEMORY_NAMESPACE)
        if isinstance(self.store, str) and (missing := missing_driver(self.store)) is not None:
            problems.append(f"Beatless store {mask_url(self.store)}: {missing}")
        return checked(
            found, problems, namespace=namespace or MEMORY_NAMESPACE, timezone=self.timezone
        )

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
        command's worker processes exit), or, with ``on_schedule_error="consume"``,
        ``None``: the problems go to :attr:`schedule_problems`, and to the log at ERROR
        once if ``report``."""
        found = self.check(broker)
        problems = list(found.problems)
        unusable: StoreError | None = None
        if found.schedule is not None and probe:
            try:
                problems = self._store_problems(broker, found.schedule)
            except StoreError as exc:
                unusable = exc
        if found.schedule is not None and not problems and unusable is None:
            return found.schedule
        if unusable is not None:
            problems = [one_line(str(unusable))]
        if self.on_schedule_error == REFUSE:
            self._refuse(
                str(refusal(problems, consume_with=CONSUME_WITH))
                if unusable is None
                else store_refusal(unusable, consume_with=CONSUME_WITH),
                problems,
            )
        self.schedule_problems = tuple(problems)
        if report and not self._reported:
            self._reported = True
            if unusable is None:
                report_consuming(logger, problems, consume_with=CONSUME_WITH)
            else:
                report_store_consuming(logger, unusable, consume_with=CONSUME_WITH)
        return None

    def _refuse(self, reason: str, problems: list[str]) -> NoReturn:
        """Say why at CRITICAL, then stop this worker: a worker process of the
        ``dramatiq`` command exits quietly (Dramatiq's multiprocessing prints any other
        exception with its traceback), an embedded ``Worker.start`` raises."""
        logger.critical("%s", reason)
        if self._under_cli:
            raise SystemExit(EXIT_REFUSED)
        raise ScheduleRefused(reason, problems)

    def _store_problems(self, broker: Broker, schedule: Schedule) -> list[str]:
        """Open the claim store, probe it and check rule 5 on it (what ``beatless check
        --store`` does); a :class:`~beatless.errors.StoreError` naming the store when it
        cannot be reached or refuses the credentials."""
        try:
            store = self._runs_store(broker)
        except ConfigError as exc:
            return [one_line(str(exc))]
        try:
            probed(store)
            return schedule.check_store(
                store.remembers, store.name, run_leases=store.holds_run_leases
            )
        finally:
            store.close()

    def _declared(self, actor: Actor[Any, Any], value: object, problems: list[str]) -> list[Entry]:
        """The entries an actor declares; what is wrong with any goes to ``problems``."""
        entries: list[Entry] = []
        for declared in collect(partial(declarations, actor.actor_name, value), problems) or ():
            entry = collect(
                partial(
                    declared.entry,
                    actor.actor_name,
                    jitter=self.jitter,
                    max_late=self.max_late,
                    catch_up=self.catch_up,
                    overlap=self.overlap,
                    run_lease=self.run_lease,
                    heartbeat=self.heartbeat,
                    once_only=self.once_only,
                ),
                problems,
            )
            if entry is not None:
                entries.append(entry)
        return entries

    def _message_problems(self, entry: Entry, actor: Actor[Any, Any], namespace: str) -> list[str]:
        """Encode one message of the entry now, so that arguments the encoder refuses
        fail at start-up, named, rather than at every firing."""
        tenants = entry.tenants if isinstance(entry.tenants, tuple) else (None,)
        tenant = tenants[0] if tenants else None
        address = f"{namespace}/{address_segment(entry.name)}"
        firing = Firing.of(entry, tenant, address if tenant is None else f"{address}/{tenant}", 0)
        try:
            message_for(firing, actor, tenant_kwarg=self.tenant_kwarg).encode()
        except Exception as exc:  # any refusal of the encoder is the answer
            encoder = get_encoder()
            named = argument_problems(
                entry, lambda value: encoder.encode({"value": value}), type(encoder).__name__
            )
            return named or [
                f"entry {entry.name!r}: its message cannot be encoded ({one_line(str(exc))}); "
                f"give it options the broker's encoder accepts"
            ]
        return []

    # -- running -------------------------------------------------------------------------

    def scheduler(self, broker: Broker, schedule: Schedule | None = None) -> Scheduler:
        """A scheduler for this node over ``broker`` (not started); it is closed with
        :meth:`close`. ``schedule`` defaults to :meth:`schedule`."""
        schedule = schedule or self.schedule(broker)
        sender = self.sender(broker)
        store = self._open_store(broker, sender)
        return Scheduler(
            schedule,
            store=store,
            enqueue=sender,
            clock=self.clock,
            node=self.node,
            lease=self.lease,
            framework="dramatiq",
            preferred=self.preferred_claimer,
        )

    def sender(self, broker: Broker) -> Sender:
        """The two-phase enqueue of this node over ``broker``: ``broker.enqueue`` on
        connections of its own whose every send ends within
        :func:`~beatless.node.scheduler.send_deadline_s` of the lease. It is closed with
        :meth:`close`."""
        sender = Sender(
            broker,
            deadline_s=send_deadline_s(to_ms(self.lease)),
            actor_of=self._actor_getter(broker),
            tenant_kwarg=self.tenant_kwarg,
        )
        self._opened.append(sender)
        return sender

    def start(self, broker: Broker) -> Scheduler | None:
        """Start the scheduler thread of this process (once), after
        :meth:`checked_at_start`: ``None`` when the node consumes without scheduling."""
        with self._lock:
            if self._scheduler is None:
                schedule = self.checked_at_start(broker)
                if schedule is None:
                    return None
                self._scheduler = self.scheduler(broker, schedule)
                self._scheduler.start()
                self._publish_metrics(self._scheduler)
            return self._scheduler

    def stop(self, timeout: float | None = 10) -> None:
        """Stop the scheduler thread, if this process runs one, and close the store."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            exported.unregister(scheduler)
            scheduler.stop(timeout)
        self.close()

    def _publish_metrics(self, scheduler: Scheduler) -> None:
        if self.metrics is False and self.metrics_port is None:
            return
        registry = None if isinstance(self.metrics, bool) else self.metrics
        exported.publish(
            scheduler, port=self.metrics_port, registry=registry, addr=self.metrics_host
        )

    def close(self) -> None:
        """Close the stores and the broker connections the middleware opened itself."""
        opened, self._opened = self._opened, []
        for store in opened:
            store.close()

    def _open_store(self, broker: Broker, sender: Sender) -> ClaimStore | Dispatcher:
        atomic = self._atomic_store(broker, sender)
        if atomic is not None:
            self._opened.append(atomic)
            logger.info("beatless: claim and enqueue in one script on the broker's Redis")
            return atomic
        store = self.store
        if store is None:
            store = _broker_store_url(broker)
        if isinstance(store, str):
            store = open_store(store, namespace=self.address_namespace)
            self._opened.append(store)
        elif _is_redis_client(store):
            from beatless.stores.redis.store import RedisStore

            store = RedisStore(store, namespace=self.address_namespace)
            self._opened.append(store)
        if not isinstance(store, ClaimStore | Dispatcher):
            raise ConfigError(
                f"Beatless: store must be a URL, a ClaimStore or a redis client, got {store!r}"
            )
        logger.info(
            "beatless: two-phase claim and enqueue through %s",
            shown(repr(store), quoted=False, limit=ERROR_LIMIT),
        )
        return store

    def _atomic_store(self, any_broker: Broker, sender: Sender) -> Dispatcher | None:
        """The one-script store when ``store`` is the Redis of a ``RedisBroker``."""
        if not is_broker(any_broker, "dramatiq.brokers.redis", "RedisBroker"):
            return None  # and neither redis nor the atomic path is imported
        from beatless.dramatiq.atomic import RedisBrokerStore
        from beatless.stores.redis.store import RedisStore

        broker = cast("RedisBroker", any_broker)
        if not self._is_broker_redis(broker):
            return None
        if not _encodes_text():
            logger.warning(
                "beatless: the message encoder writes binary data, which the claim script "
                "cannot carry; claim and enqueue are two-phase on the broker's Redis"
            )
            return None
        given = self.store if isinstance(self.store, RedisStore) else None
        redis_store = given or RedisStore(broker.client, namespace=self.address_namespace)
        return RedisBrokerStore(
            broker,
            redis_store,
            self._actor_getter(broker),
            tenant_kwarg=self.tenant_kwarg,
            owns_store=given is None,
            lease=self.lease,
            enqueue=sender,
        )

    def _is_broker_redis(self, broker: RedisBroker) -> bool:
        from beatless.dramatiq.atomic import same_redis, url_is_broker_redis
        from beatless.stores.redis.store import SCHEMES, RedisStore

        store = self.store
        if store is None:
            return True  # the store follows the broker
        if isinstance(store, str):
            scheme = store.split(":", 1)[0].lower()
            return scheme in SCHEMES and url_is_broker_redis(store, broker)
        if isinstance(store, RedisStore):
            return same_redis(store.client, broker.client)
        return _is_redis_client(store) and same_redis(store, broker.client)

    @staticmethod
    def _actor_getter(broker: Broker) -> Callable[[str], Actor[Any, Any]]:
        return lambda task: _actor(broker, task, task)


def _attempt(message: MessageProxy) -> int:
    """The attempt of a message: how many times Dramatiq's ``Retries`` retried it."""
    retries = message.options.get("retries", 0)
    return retries if isinstance(retries, int) and retries >= 0 else 0


class _Borrowed(ClaimStore):
    """A store the middleware was given (or the scheduler's): used by the runs, never
    closed by them."""

    def __init__(self, store: ClaimStore) -> None:
        self.store = store
        self.name = store.name
        self.notes_live_ms = store.notes_live_ms
        self.commits_notes = store.commits_notes

    def __repr__(self) -> str:
        return repr(self.store)

    def time_ms(self) -> int:
        return self.store.time_ms()

    def probe(self) -> None:
        self.store.probe()

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self.store.claim(requests, node=node, lease_ms=lease_ms)

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        return self.store.commit(ids, node=node, notes=notes)

    def release(self, ids: Sequence[str], *, node: str) -> None:
        self.store.release(ids, node=node)

    def post(self, notes: Sequence[Note]) -> None:
        self.store.post(notes)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        return self.store.read_notes(kinds)


def _where(store: Any) -> str:
    if store is None:
        return "of the broker's own server"
    return mask_url(store) if isinstance(store, str) else type(store).__name__


def _broker_store_url(broker: Broker) -> str:
    """The claim store that follows a broker with no ``store`` given: a RabbitMQ broker's
    own server, as an ``amqp://`` URL of its first connection parameters. (A
    ``RedisBroker`` never gets here: its own Redis is the atomic path.)"""
    if not is_broker(broker, "dramatiq.brokers.rabbitmq", "RabbitmqBroker"):
        raise ConfigError(
            f"Beatless: give store= with a {type(broker).__name__}: only a RedisBroker's or "
            f"a RabbitmqBroker's own server can be the claim store without one"
        )
    parameters = broker.parameters  # type: ignore[attr-defined]
    first = parameters[0] if isinstance(parameters, list) else parameters
    credentials = first.credentials
    user = quote(str(getattr(credentials, "username", "guest")), safe="")
    password = quote(str(getattr(credentials, "password", "guest")), safe="")
    scheme = "amqps" if first.ssl_options is not None else "amqp"
    vhost = quote(str(first.virtual_host), safe="")
    return f"{scheme}://{user}:{password}@{first.host}:{first.port}/{vhost}"


def _actor(broker: Broker, task: str, entry: str) -> Actor[Any, Any]:
    try:
        return broker.get_actor(task)
    except Exception:
        declared = ", ".join(sorted(broker.actors)) or "none"
        raise ConfigError(
            f"entry {entry!r}: task {task!r} is not an actor of this broker (declared: "
            f"{declared}); import the module that declares it before the worker starts"
        ) from None


def _is_redis_client(value: object) -> bool:
    try:
        import redis
    except ImportError:
        return False
    return isinstance(value, redis.Redis)


def _encodes_text() -> bool:
    """Whether Dramatiq's message encoder writes UTF-8 text (its default JSON does)."""
    from dramatiq import Message

    probe: Message[Any] = Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={})
    try:
        probe.encode().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _on_schedule_error(value: str) -> str:
    return on_schedule_error(value, name="Beatless: on_schedule_error")


def _is_memory(store: Any) -> bool:
    if isinstance(store, str):
        return urlsplit(store).scheme.lower() == "memory"
    return isinstance(store, MemoryStore)


def find(broker: Broker) -> Sequence[Beatless]:
    """The ``Beatless`` middleware added to ``broker``."""
    return [m for m in broker.middleware if isinstance(m, Beatless)]
