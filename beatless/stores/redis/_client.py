"""The redis-py client of a Redis store: the driver, a client made from a URL (with the
store's own ``wait`` options taken out), its description and secrets, and redis-py's
errors said as beatless's."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from beatless.core._drivers import driver
from beatless.core.durations import DurationLike, as_timedelta
from beatless.core.urls import mask_url, scrub
from beatless.errors import ConfigError, StoreError, StoreFull, StoreUnavailable
from beatless.stores.redis import _sentinel
from beatless.stores.redis._facts import is_oom
from beatless.stores.redis._packer import use_packer

if TYPE_CHECKING:
    import redis as redis_module
    from redis.commands.core import Script


DEFAULT_SOCKET_TIMEOUT = 5.0
"""Seconds a client created from a URL waits to connect, and for each reply."""

DEFAULT_WAIT_TIMEOUT = 1.0
"""Seconds a claim or commit of a store with ``wait`` waits for its replicas (``WAIT``);
a two-phase claim waits at most a quarter of its lease, so that it can still be sent."""

WAIT_OPTIONS = ("wait", "wait_timeout")
"""The query options of a store URL that the store reads itself (the driver does not)."""

UNACKNOWLEDGED = {
    "claim": (
        "its firings are not sent now and are claimed again while not late (a two-phase "
        "claim stays this node's; one claimed and enqueued in one script is in the queue "
        "on the primary, and is lost with the claim if the primary is)"
    ),
    "commit": (
        "the sent firings stay uncommitted, and nothing more is sent until they are committed again"
    ),
}
"""What a claim or a commit that too few replicas acknowledged leaves behind, for its error."""


SCHEMES = ("redis", "rediss", "unix")


def key_prefix(store: str, namespace: object, prefix: str | None) -> str:
    """The prefix of a store's keys: ``prefix``, or ``beatless:{namespace}:``; a namespace
    that is not a non-empty string is refused, naming ``store``."""
    if not isinstance(namespace, str) or not namespace:
        raise ConfigError(f"{store}: namespace must be a non-empty string, got {namespace!r}")
    return prefix if prefix is not None else f"beatless:{namespace}:"


def redis_driver(store: str = "the redis store") -> ModuleType:
    return driver("redis", store)


@contextmanager
def driver_errors(
    driver: ModuleType,
    store: str,
    what: str,
    secrets: Sequence[str],
    *,
    unavailable: tuple[type[BaseException], ...] = (),
    failed: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """redis-py's errors as beatless's, for the store that ``store`` names (its kind and
    masked URL), with ``secrets`` masked in every message: a refused login is a
    :class:`~beatless.errors.StoreError` that says to check it; a connection lost, timed
    out or read-only (and ``unavailable``) is :class:`~beatless.errors.StoreUnavailable`,
    which the loop retries; any other Redis error (and ``failed``) is a
    :class:`~beatless.errors.StoreError`."""
    exc = driver.exceptions
    try:
        yield
    except (exc.AuthenticationError, exc.AuthorizationError) as error:
        raise StoreError(
            f"{store}: cannot {what}: {masked(error, secrets)}; check the user name and password"
        ) from None
    except (exc.ConnectionError, exc.TimeoutError, exc.ReadOnlyError, *unavailable) as error:
        raise StoreUnavailable(f"{store}: cannot {what}: {masked(error, secrets)}") from None
    except (exc.RedisError, *failed) as error:
        if is_oom(error):
            raise StoreFull(f"{store}: cannot {what}: {masked(error, secrets)}") from None
        raise StoreError(f"{store}: cannot {what}: {masked(error, secrets)}") from None


def masked(exc: BaseException, secrets: Sequence[str]) -> str:
    text = str(exc) or type(exc).__name__
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def client_from_url(
    driver: ModuleType, url: str, socket_timeout: DurationLike, where: str
) -> redis_module.Redis:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in (*SCHEMES, _sentinel.SCHEME):
        raise ConfigError(
            f"redis store: unknown URL scheme {scheme!r} in {where}: use redis://host:port/db, "
            f"rediss://host:port/db, unix:///path/to/redis.sock or {_sentinel.FORM}"
        )
    timeout = as_timedelta(socket_timeout, name="redis store: socket_timeout").total_seconds()
    if timeout <= 0:
        raise ConfigError(f"redis store: socket_timeout must be positive, got {socket_timeout!r}")
    retry = driver.retry.Retry(driver.backoff.NoBackoff(), 1)
    if scheme == _sentinel.SCHEME:
        client: redis_module.Redis = _sentinel.sentinel_client(driver, url, timeout, retry, where)
    else:
        try:
            client = driver.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=retry
            )
        except ValueError as exc:
            raise ConfigError(f"redis store: bad URL {where}: {scrub(str(exc), url)}") from None
    use_packer(driver, client)
    return client


def secrets_of_client(client: redis_module.Redis) -> list[str]:
    if _sentinel.is_sentinel(client):
        return _sentinel.describe(client)[1]
    password = client.connection_pool.connection_kwargs.get("password")
    return [str(password)] if password else []


def describe_client(client: redis_module.Redis) -> str:
    if _sentinel.is_sentinel(client):
        return _sentinel.describe(client)[0]
    kwargs = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{db}"


def wait_in_url(url: str, wait: int, timeout: DurationLike) -> tuple[str, int, DurationLike]:
    """``url`` without its ``wait`` and ``wait_timeout`` options, and their values (those
    given when the URL has none): the driver would refuse them."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in WAIT_OPTIONS}
    if not ours:
        return url, wait, timeout
    rest = urlencode([(k, v) for k, v in query if k not in WAIT_OPTIONS])
    given = ours.get("wait", str(wait))
    if not given.isdigit():
        raise ConfigError(
            f"redis store {mask_url(url)}: wait={given!r} must be a number of replicas (0, 1, ...)"
        )
    return urlunsplit(parts._replace(query=rest)), int(given), ours.get("wait_timeout", timeout)


def checked_wait(client: Any, wait: int, timeout: DurationLike) -> tuple[int, int]:
    """``wait`` and ``timeout`` in ms, checked: a timeout under the client's socket
    timeout, so that ``WAIT`` answers before the connection gives up."""
    if isinstance(wait, bool) or not isinstance(wait, int) or wait < 0:
        raise ConfigError(f"redis store: wait must be 0 or more replicas, got {wait!r}")
    ms = int(as_timedelta(timeout, name="redis store: wait_timeout").total_seconds() * 1_000)
    if ms <= 0:
        raise ConfigError(f"redis store: wait_timeout must be positive, got {timeout!r}")
    socket_s = client.connection_pool.connection_kwargs.get("socket_timeout")
    if wait and socket_s and ms >= socket_s * 1_000:
        raise ConfigError(
            f"redis store: wait_timeout {ms} ms must be under the socket timeout "
            f"({socket_s * 1_000:.0f} ms), or every unacknowledged claim is a lost connection"
        )
    return wait, ms


def server_identity(client: Any) -> tuple[str, int]:
    """``(run_id, db)`` of the server and database a redis-py client talks to.

    ``run_id`` is drawn by a Redis server when it starts, so two clients with the same
    identity reach one server, whatever host name or address each was given.
    """
    run_id = str(client.info("server")["run_id"])
    return run_id, int(client.connection_pool.connection_kwargs.get("db", 0) or 0)


Call = tuple["Script", list[str], list[str | int]]
"""A script call of a pipeline: its script, keys and ARGV."""


def run_acknowledged(
    client: Any,
    script: Script,
    calls: list[tuple[list[str], list[str | int]]],
    *,
    replicas: int,
    ms: int,
    noscript: type[BaseException],
    then: Sequence[Call] = (),
) -> tuple[list[Any], int]:
    """Run ``script`` once per call, then the calls of ``then``, then ``WAIT`` for
    ``replicas`` to have what they wrote, up to ``ms``, in one pipeline (one connection,
    one round trip): the replies, as :func:`run_scripts` gives them, and how many
    replicas acknowledged. What is run again after ``NOSCRIPT`` has a ``WAIT`` of its
    own."""
    every = [(script, keys, args) for keys, args in calls] + list(then)
    acked: list[Any] = [0]

    def send(todo: list[int]) -> list[Any]:
        pipe = _pipeline(client, [every[i] for i in todo])
        pipe.wait(replicas, ms)
        *got, acked[0] = pipe.execute(raise_on_error=False)
        if isinstance(acked[0], Exception):
            raise acked[0]
        return list(got)

    replies = _run_calls(client, every, len(calls), noscript, send)
    return replies, int(acked[0])


def run_scripts(
    client: Any,
    script: Script,
    calls: list[tuple[list[str], list[str | int]]],
    *,
    noscript: type[BaseException],
    then: Sequence[Call] = (),
) -> list[Any]:
    """Run ``script`` once per call (one EVALSHA, or several pipelined in one round trip),
    then, once they have answered, the calls of ``then`` in a round trip of their own. The
    replies, ``then``'s after the others'; the first error of the others is raised, an
    error of one of ``then`` (the connection's too) is its reply. A call answered
    ``NOSCRIPT`` is run again once its script is loaded.

    Why ``then`` waits for the replies: Redis answers a client blocked on a list (a
    consumer on its queue) only between the reads of its event loop, after every command
    of the bytes it read. Sent in the same pipeline, ``then`` would run before a consumer
    that the first calls served could pop again: a queue's second message would wait for
    it."""
    every = [(script, keys, args) for keys, args in calls]
    try:
        if len(calls) <= 1:
            replies = [script(keys, args) for keys, args in calls]
        else:
            replies = _run_calls(client, every, len(every), noscript, _sender(client, every))
    except Exception:
        _then(client, then, noscript)  # what the calls that ran left for them
        raise
    return replies + _then(client, then, noscript)


def _then(client: Any, then: Sequence[Call], noscript: type[BaseException]) -> list[Any]:
    """The replies of the calls of ``then``, run in one round trip; an error is a reply."""
    if not then:
        return []
    after = list(then)
    try:
        return _run_calls(client, after, 0, noscript, _sender(client, after))
    except Exception as exc:  # the calls before stand: this is their reply
        return [exc] * len(after)


def _sender(client: Any, every: list[Call]) -> Callable[[list[int]], list[Any]]:
    """Sends the calls of ``every`` at the given indexes in one pipeline: their replies."""

    def send(todo: list[int]) -> list[Any]:
        got: list[Any] = _pipeline(client, [every[i] for i in todo]).execute(raise_on_error=False)
        return got

    return send


def _pipeline(client: Any, calls: list[Call]) -> Any:
    """A pipeline (no transaction) with one ``EVALSHA`` per call, in order."""
    pipe = client.pipeline(transaction=False)
    for called, keys, args in calls:
        pipe.evalsha(called.sha, len(keys), *keys, *args)
    return pipe


def _run_calls(
    client: Any,
    every: list[Call],
    first: int,
    noscript: type[BaseException],
    send: Callable[[list[int]], list[Any]],
) -> list[Any]:
    """The replies of ``every`` (the first ``first`` calls, whose errors are raised, then
    the others), sent by ``send`` in order, and once more, after loading the scripts, for
    the calls answered ``NOSCRIPT`` (with every call after the first ``first``, when one
    of those is among them)."""
    replies: list[Any] = [None] * len(every)
    todo = list(range(len(every)))
    for attempt in range(2):
        missing = []
        for i, reply in zip(todo, send(todo), strict=True):
            if isinstance(reply, noscript) and attempt == 0:
                missing.append(i)
            elif isinstance(reply, Exception) and i < first:
                raise reply
            elif replies[i] is None or replies[i] == 0 or isinstance(replies[i], Exception):
                replies[i] = reply
        if not missing:
            break
        for called in {id(every[i][0]): every[i][0] for i in missing}.values():
            called.sha = client.script_load(called.script)
        if missing[0] < first:
            missing = sorted({*missing, *range(first, len(every))})
        todo = missing
    return replies
