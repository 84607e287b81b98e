"""The ``Beatless`` middleware: one scheduler per node, no scheduler process to run.

Under the ``dramatiq`` CLI the scheduler runs in the middleware's fork (see
:mod:`beatless.dramatiq.fork`); with a :class:`dramatiq.Worker` started in your own
process it runs in a thread started and stopped with the worker. Never both: the CLI's
worker processes emit ``after_process_boot``, and from then on the thread is not started.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from dramatiq import Middleware

from beatless.dispatch import Dispatcher
from beatless.dramatiq.messages import message_for
from beatless.dramatiq.periodic import OPTION, declarations
from beatless.dramatiq.sending import Sender, is_broker
from beatless.durations import DurationLike, as_timedelta, to_ms
from beatless.entry import DEFAULT_MAX_LATE, Entry, Schedule
from beatless.errors import ConfigError
from beatless.firing import Firing
from beatless.scheduler import Scheduler, send_deadline_s
from beatless.stores import open_store
from beatless.stores.base import ClaimStore
from beatless.urls import mask_url

if TYPE_CHECKING:
    from dramatiq import Actor, Broker, Worker
    from dramatiq.brokers.redis import RedisBroker

logger = logging.getLogger(__name__)


class Beatless(Middleware):
    """Periodic tasks for a Dramatiq broker: ``broker.add_middleware(Beatless(store=...))``.

    ``store`` is a claim-store URL (``redis://``, ``sqlite:///``, ``memory://``), a
    :class:`~beatless.stores.base.ClaimStore`, or a ``redis.Redis`` client. When it is
    the Redis of a ``RedisBroker`` (same server and database), claim and enqueue are one
    script; otherwise a firing is claimed, enqueued with ``broker.enqueue`` and committed.

    ``entries`` are :class:`~beatless.Entry` values whose ``task`` is an actor name;
    actors declared with the ``periodic`` option are added to them when the scheduler
    starts. ``jitter`` and ``max_late`` are the defaults of those declarations.
    ``tenant_kwarg`` is the keyword argument a fan-out firing passes its tenant in
    (``None``: only in the message options).
    """

    def __init__(
        self,
        *,
        store: Any,
        entries: Iterable[Entry] = (),
        namespace: str = "default",
        timezone: str = "UTC",
        jitter: DurationLike = 0,
        max_late: DurationLike = DEFAULT_MAX_LATE,
        lease: DurationLike = timedelta(seconds=30),
        tenant_kwarg: str | None = "tenant",
        node: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.entries = tuple(entries)
        for entry in self.entries:
            if not isinstance(entry, Entry):
                raise ConfigError(f"Beatless entries must be Entry values, got {entry!r}")
        self.namespace = namespace
        self.timezone = timezone
        self.jitter = as_timedelta(jitter, name="Beatless: jitter")
        self.max_late = as_timedelta(max_late, name="Beatless: max_late")
        self.lease = as_timedelta(lease, name="Beatless: lease")
        self.tenant_kwarg = tenant_kwarg
        self.node = node
        self.clock = clock
        Schedule(self.entries, namespace=namespace, timezone=timezone)  # fail early
        self._under_cli = False
        self._scheduler: Scheduler | None = None
        self._opened: list[Any] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        where = mask_url(self.store) if isinstance(self.store, str) else repr(self.store)
        return f"Beatless(store={where!r}, namespace={self.namespace!r})"

    # -- Dramatiq's middleware surface ---------------------------------------------------

    @property
    def actor_options(self) -> set[str]:
        return {OPTION}

    @property
    def forks(self) -> list[Callable[[], int]]:
        from beatless.dramatiq.fork import run_scheduler

        return [run_scheduler]

    def after_process_boot(self, broker: Broker) -> None:
        # Only the dramatiq CLI's worker processes emit this: the fork runs the scheduler.
        self._under_cli = True

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        if self._under_cli:
            return
        self.start(broker)

    def before_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        self.stop()

    # -- the schedule --------------------------------------------------------------------

    def schedule(self, broker: Broker) -> Schedule:
        """The node's schedule: ``entries`` and the broker's periodic actors, checked."""
        found = list(self.entries)
        for actor in list(broker.actors.values()):
            value = actor.options.get(OPTION)
            if value is None:
                continue
            for declared in declarations(actor.actor_name, value):
                found.append(
                    declared.entry(actor.actor_name, jitter=self.jitter, max_late=self.max_late)
                )
        schedule = Schedule(found, namespace=self.namespace, timezone=self.timezone)
        for entry in schedule.entries:
            self._check_message(schedule, entry, _actor(broker, entry.task, entry.name))
        return schedule

    def _check_message(self, schedule: Schedule, entry: Entry, actor: Actor[Any, Any]) -> None:
        """Encode one message of the entry now, so that arguments the encoder refuses
        fail at start-up rather than at every firing."""
        tenants = entry.tenants if isinstance(entry.tenants, tuple) else (None,)
        tenant = tenants[0] if tenants else None
        firing = Firing.of(entry, tenant, schedule.address(entry, tenant), 0)
        try:
            message_for(firing, actor, tenant_kwarg=self.tenant_kwarg).encode()
        except Exception as exc:
            raise ConfigError(
                f"entry {entry.name!r}: its message cannot be encoded ({exc}); give it "
                f"arguments and options the broker's encoder accepts"
            ) from None

    # -- running -------------------------------------------------------------------------

    def scheduler(self, broker: Broker) -> Scheduler:
        """A scheduler for this node over ``broker`` (not started); it is closed with
        :meth:`close`."""
        schedule = self.schedule(broker)
        sender = self.sender(broker)
        store = self._open_store(broker, sender)
        return Scheduler(
            schedule,
            store=store,
            enqueue=sender,
            clock=self.clock,
            node=self.node,
            lease=self.lease,
        )

    def sender(self, broker: Broker) -> Sender:
        """The two-phase enqueue of this node over ``broker``: ``broker.enqueue`` on
        connections of its own whose every send ends within
        :func:`~beatless.scheduler.send_deadline_s` of the lease. It is closed with
        :meth:`close`."""
        sender = Sender(
            broker,
            deadline_s=send_deadline_s(to_ms(self.lease)),
            actor_of=self._actor_getter(broker),
            tenant_kwarg=self.tenant_kwarg,
        )
        self._opened.append(sender)
        return sender

    def start(self, broker: Broker) -> Scheduler:
        """Start the scheduler thread of this process (once)."""
        with self._lock:
            if self._scheduler is None:
                self._scheduler = self.scheduler(broker)
                self._scheduler.start()
            return self._scheduler

    def stop(self, timeout: float | None = 10) -> None:
        """Stop the scheduler thread, if this process runs one, and close the store."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.stop(timeout)
        self.close()

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
        if isinstance(store, str):
            store = open_store(store, **self._store_options(store))
            self._opened.append(store)
        elif _is_redis_client(store):
            from beatless.stores.redis import RedisStore

            store = RedisStore(store, namespace=self.namespace)
            self._opened.append(store)
        if not isinstance(store, ClaimStore | Dispatcher):
            raise ConfigError(
                f"Beatless: store must be a URL, a ClaimStore or a redis client, got {store!r}"
            )
        logger.info("beatless: two-phase claim and enqueue through %r", store)
        return store

    def _store_options(self, url: str) -> dict[str, Any]:
        scheme = url.split(":", 1)[0].lower()
        return {"namespace": self.namespace} if scheme in ("redis", "rediss", "unix") else {}

    def _atomic_store(self, any_broker: Broker, sender: Sender) -> Dispatcher | None:
        """The one-script store when ``store`` is the Redis of a ``RedisBroker``."""
        if not is_broker(any_broker, "dramatiq.brokers.redis", "RedisBroker"):
            return None  # and neither redis nor the atomic path is imported
        from beatless.dramatiq.atomic import RedisBrokerStore
        from beatless.stores.redis import RedisStore

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
        redis_store = given or RedisStore(broker.client, namespace=self.namespace)
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
        from beatless.stores.redis import SCHEMES, RedisStore

        store = self.store
        if isinstance(store, str):
            scheme = store.split(":", 1)[0].lower()
            return scheme in SCHEMES and url_is_broker_redis(store, broker)
        if isinstance(store, RedisStore):
            return same_redis(store._client, broker.client)
        return _is_redis_client(store) and same_redis(store, broker.client)

    @staticmethod
    def _actor_getter(broker: Broker) -> Callable[[str], Actor[Any, Any]]:
        return lambda task: _actor(broker, task, task)


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


def find(broker: Broker) -> Sequence[Beatless]:
    """The ``Beatless`` middleware added to ``broker``."""
    return [m for m in broker.middleware if isinstance(m, Beatless)]
