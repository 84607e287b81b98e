"""The claim store of a Dramatiq node: given, or following the broker.

``store`` is a URL, a :class:`~beatless.stores.base.ClaimStore` or a ``redis.Redis``
client; left out, it follows the broker: a ``RedisBroker``'s own Redis, a
``RabbitmqBroker``'s own RabbitMQ. When it is the Redis of a ``RedisBroker`` (the same
server and database, asked of the servers), the scheduler claims and enqueues in one
script (:class:`~beatless.dramatiq._atomic.RedisBrokerStore`); otherwise two-phase. The
runs of the workers (:mod:`beatless.dramatiq._gate`) and ``beatless status`` use the same
store, opened on their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.dramatiq._sending import Sender, is_broker
from beatless.dramatiq._settings import DramatiqSettings
from beatless.errors import ConfigError
from beatless.node.dispatch import Dispatcher
from beatless.schedule.entry import Schedule
from beatless.schedule.problems import one_line
from beatless.stores import open_store, probed
from beatless.stores.base import ClaimRequest, ClaimStore, KeptNote, Note, Outcome

if TYPE_CHECKING:
    from dramatiq import Actor, Broker
    from dramatiq.brokers.redis import RedisBroker

logger = logging.getLogger(__name__)

NOT_A_STORE = "Beatless: store must be a URL, a ClaimStore or a redis client, got {!r}"


def claim_store(
    settings: DramatiqSettings, broker: Broker, sender: Sender, opened: list[Any]
) -> ClaimStore | Dispatcher:
    """What the scheduler claims through: the one-script store on a ``RedisBroker``'s own
    Redis, else the claim store, with ``sender`` as its two-phase enqueue. What it opens
    is added to ``opened``, for the caller to close."""
    atomic = _atomic_store(settings, broker, sender)
    if atomic is not None:
        opened.append(atomic)
        logger.info("beatless: claim and enqueue in one script on the broker's Redis")
        return atomic
    store = settings.store
    if store is None:
        store = broker_store_url(broker)
    if isinstance(store, str):
        store = open_store(store, namespace=settings.address_namespace)
        opened.append(store)
    elif is_redis_client(store):
        from beatless.stores.redis.store import RedisStore

        store = RedisStore(store, namespace=settings.address_namespace)
        opened.append(store)
    if not isinstance(store, ClaimStore | Dispatcher):
        raise ConfigError(NOT_A_STORE.format(store))
    logger.info(
        "beatless: two-phase claim and enqueue through %s",
        shown(repr(store), quoted=False, limit=ERROR_LIMIT),
    )
    return store


def runs_store(
    settings: DramatiqSettings, broker: Broker, scheduler_store: ClaimStore | None = None
) -> ClaimStore:
    """The claim store of this process's runs: the one the scheduler claims in, opened
    on its own (a store given, or the running scheduler's memory store, is borrowed)."""
    store = settings.store
    if isinstance(store, Dispatcher):
        store = store.store
    if isinstance(store, ClaimStore):
        return Borrowed(store)
    if settings.on_memory and scheduler_store is not None:
        return Borrowed(scheduler_store)  # one process: the scheduler's own memory
    namespace = settings.address_namespace
    if store is None and is_broker(broker, "dramatiq.brokers.redis", "RedisBroker"):
        from beatless.stores.redis.store import RedisStore

        return RedisStore(cast("RedisBroker", broker).client, namespace=namespace)
    if store is None:
        store = broker_store_url(broker)
    if isinstance(store, str):
        return open_store(store, namespace=namespace)
    if is_redis_client(store):
        from beatless.stores.redis.store import RedisStore

        return RedisStore(store, namespace=namespace)
    raise ConfigError(NOT_A_STORE.format(store))


def store_problems(
    settings: DramatiqSettings,
    broker: Broker,
    schedule: Schedule,
    scheduler_store: ClaimStore | None = None,
) -> list[str]:
    """Open the claim store, probe it and check rule 5 on it (what ``beatless check
    --store`` does); a :class:`~beatless.errors.StoreError` naming the store when it
    cannot be reached or refuses the credentials."""
    try:
        store = runs_store(settings, broker, scheduler_store)
    except ConfigError as exc:
        return [one_line(str(exc))]
    try:
        probed(store)
        return schedule.check_store(store.remembers, store.name, run_leases=store.holds_run_leases)
    finally:
        store.close()


def _atomic_store(
    settings: DramatiqSettings, any_broker: Broker, sender: Sender
) -> Dispatcher | None:
    """The one-script store when ``store`` is the Redis of a ``RedisBroker``."""
    if not is_broker(any_broker, "dramatiq.brokers.redis", "RedisBroker"):
        return None  # and neither redis nor the atomic path is imported
    from beatless.dramatiq._atomic import RedisBrokerStore
    from beatless.stores.redis.store import RedisStore

    broker = cast("RedisBroker", any_broker)
    if not _is_broker_redis(settings.store, broker):
        return None
    if not _encodes_text():
        logger.warning(
            "beatless: the message encoder writes binary data, which the claim script "
            "cannot carry; claim and enqueue are two-phase on the broker's Redis"
        )
        return None
    given = settings.store if isinstance(settings.store, RedisStore) else None
    redis_store = given or RedisStore(broker.client, namespace=settings.address_namespace)
    return RedisBrokerStore(
        broker,
        redis_store,
        actor_getter(broker),
        tenant_kwarg=settings.tenant_kwarg,
        owns_store=given is None,
        lease=settings.lease,
        enqueue=sender,
    )


def _is_broker_redis(store: Any, broker: RedisBroker) -> bool:
    from beatless.dramatiq._atomic import same_redis, url_is_broker_redis
    from beatless.stores.redis.store import SCHEMES, RedisStore

    if store is None:
        return True  # the store follows the broker
    if isinstance(store, str):
        scheme = store.split(":", 1)[0].lower()
        return scheme in SCHEMES and url_is_broker_redis(store, broker)
    if isinstance(store, RedisStore):
        return same_redis(store.client, broker.client)
    return is_redis_client(store) and same_redis(store, broker.client)


def actor_getter(broker: Broker) -> Callable[[str], Actor[Any, Any]]:
    """The actor of an entry's task on ``broker``, by the task's name."""
    return lambda task: actor(broker, task, task)


def actor(broker: Broker, task: str, entry: str) -> Actor[Any, Any]:
    """The actor named ``task``; a :class:`~beatless.errors.ConfigError` naming ``entry``
    and the declared actors when there is none."""
    try:
        return broker.get_actor(task)
    except Exception:
        declared = ", ".join(sorted(broker.actors)) or "none"
        raise ConfigError(
            f"entry {entry!r}: task {task!r} is not an actor of this broker (declared: "
            f"{declared}); import the module that declares it before the worker starts"
        ) from None


def broker_store_url(broker: Broker) -> str:
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


def is_redis_client(value: object) -> bool:
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


class Borrowed(ClaimStore):
    """A store the middleware was given (or the scheduler's): used by the runs, never
    closed by them."""

    def __init__(self, store: ClaimStore) -> None:
        self.store = store
        self.name = store.name
        self.notes_live_ms = store.notes_live_ms
        self.commits_notes = store.commits_notes
        self.keeps_notes = store.keeps_notes
        self.why_not_kept = store.why_not_kept

    def __repr__(self) -> str:
        return repr(self.store)

    def time_ms(self) -> int:
        return self.store.time_ms()

    def probe(self) -> None:
        self.store.probe()

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        return self.store.claim(requests, node=node, lease_ms=lease_ms)

    def claim_held_off(
        self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int
    ) -> list[Outcome]:
        return self.store.claim_held_off(requests, node=node, lease_ms=lease_ms)

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        return self.store.commit(ids, node=node, notes=notes)

    def release(self, ids: Sequence[str], *, node: str) -> None:
        self.store.release(ids, node=node)

    def post(self, notes: Sequence[Note]) -> None:
        self.store.post(notes)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        return self.store.read_notes(kinds)

    def read_logs(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        return self.store.read_logs(kinds)

    def keep_notes(self, notes: Sequence[KeptNote]) -> None:
        self.store.keep_notes(notes)

    def read_kept(self, kind: str, keys: Sequence[str] | None = None) -> dict[str, str]:
        return self.store.read_kept(kind, keys)

    def delete_kept(self, kind: str, keys: Sequence[str]) -> None:
        self.store.delete_kept(kind, keys)
