"""The layout of the Redis Cluster store (:mod:`beatless.stores.redis.cluster`): its
buckets and keys, its scripts, and the options of the cluster client it makes from a URL.

``{prefix}{bb}:claim:{id}``
    The claim record of a firing, a run lease or a once-only record, in the layout of
    the Redis store (:mod:`beatless.stores.redis.store`), expiring as it does.
``{prefix}{bb}:epoch``
    ``v=2|{started_ms}|{token}|{replid}|{cause}``: the bucket's identity, written (no
    expiry) for every bucket at once by the first store object of the namespace, and
    again by a claim in a bucket that lost it or whose master is a promoted replica.
``{prefix}{notes:<digest>}`` and ``{prefix}{notes:<digest>}:expiry``
    A kind of notes (the SHA-256 of the kind in hex): its hash and its expiry index, as
    the Redis store keeps them.
``{prefix}{notes:<digest>}:log``
    The kind's log, in the slot of its hash: its logged notes, as the Redis store keeps
    them (:mod:`beatless.stores.redis._logs`).
``{prefix}{kept:<digest>}``
    A kind of kept notes, with no expiry (:mod:`beatless.stores.redis._kept`).
``{prefix}{bb}:probe:{random}``
    Written, read back and deleted by :meth:`RedisClusterStore.probe`, one per master.

"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from beatless.core.durations import DurationLike, as_timedelta
from beatless.core.urls import scrub
from beatless.errors import ConfigError
from beatless.stores.base import Epoch
from beatless.stores.redis._wire import (
    CHUNK,
    CLAIM,
    COMMIT,
    COMMIT_WITHOUT_ROOM,
    EPOCHS,
    POST,
    RELEASE,
    script,
)

SCHEMES = ("redis+cluster", "rediss+cluster")
BUCKET_DIGITS = 2
BUCKETS = tuple(f"{b:02x}" for b in range(16**BUCKET_DIGITS))
"""Every bucket: a hash tag each, so 256 slots spread over the masters."""
_HEX = frozenset(string.hexdigits)
HELD_RUN = -1
"""The ``run`` of a claim argument whose run lease was read held just before the claim
(``claim.lua`` then answers overlap for it as for a run-lease key of its own)."""


@dataclass(frozen=True, slots=True)
class Lua:
    """A script and its SHA-1, sent by ``EVALSHA`` and loaded on ``NOSCRIPT``."""

    text: str
    sha: str

    @classmethod
    def of(cls, text: str) -> Lua:
        return cls(text, hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest())


CLAIM_LUA, COMMIT_LUA, RELEASE_LUA, POST_LUA = map(Lua.of, (CLAIM, COMMIT, RELEASE, POST))
ANYWAY = Lua.of(COMMIT_WITHOUT_ROOM)
"""The commit script flagged ``allow-oom``: for claims whose commit was refused as full."""
EPOCHS_LUA = Lua.of(EPOCHS)
RUNNING_LUA = Lua.of(script("prelude.lua", "running.lua"))
READ_NOTES_LUA = Lua.of(script("read_notes.lua"))
READ_LOG_LUA = Lua.of(script("read_log.lua"))

Call = tuple[list[str], list[str | int]]


class Unreachable(Exception):
    """No node of the cluster could be reached (redis-py says so with a generic error)."""


def bucket_of(id_: str) -> str:
    head = id_[:BUCKET_DIGITS].lower()
    if len(head) == BUCKET_DIGITS and _HEX.issuperset(head):
        return head
    return hashlib.sha256(id_.encode()).hexdigest()[:BUCKET_DIGITS]


def chunks(ids: Sequence[str]) -> Iterator[tuple[str, list[int]]]:
    """The positions of ``ids`` by bucket, at most ``CHUNK`` per script."""
    by_bucket: dict[str, list[int]] = {}
    for i, id_ in enumerate(ids):
        by_bucket.setdefault(bucket_of(id_), []).append(i)
    for bucket, places in by_bucket.items():
        for start in range(0, len(places), CHUNK):
            yield bucket, places[start : start + CHUNK]


def digest(epochs: dict[str, Epoch]) -> Epoch:
    """One epoch for the store object: changes when the epoch of any bucket does."""
    tokens = "|".join(f"{bucket}={epochs[bucket].token}" for bucket in sorted(epochs))
    token = hashlib.sha256(tokens.encode()).hexdigest()[:32]
    return Epoch(token, max(epoch.started_ms for epoch in epochs.values()))


def cluster_options(
    driver: ModuleType, url: str, socket_timeout: DurationLike, where: str
) -> dict[str, Any]:
    """The keyword arguments of ``RedisCluster`` for a ``redis+cluster://`` URL, checked
    now so that a bad URL is a :class:`~beatless.errors.ConfigError` at construction."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"redis cluster store: unknown URL scheme {scheme!r} in {where}: use "
            f"redis+cluster://host:port[,host:port...] or rediss+cluster://..."
        )
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes = [host_port(node, where) for node in hosts.split(",") if node.strip()]
    if not nodes:
        raise ConfigError(f"redis cluster store: no node in {where}: name at least one host:port")
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"redis cluster store: {where}: a cluster has database 0 only")
    timeout = as_timedelta(socket_timeout, name="redis cluster store: socket_timeout")
    seconds = timeout.total_seconds()
    if seconds <= 0:
        raise ConfigError(
            f"redis cluster store: socket_timeout must be positive, got {socket_timeout!r}"
        )
    host, port = nodes[0]
    first = f"{scheme.split('+')[0]}://{userinfo}{at}{netloc(host, port)}"
    first += f"?{parts.query}" if parts.query else ""
    try:
        driver.connection.parse_url(first)
    except ValueError as exc:
        raise ConfigError(f"redis cluster store: bad URL {where}: {scrub(str(exc), url)}") from None
    startup = [driver.cluster.ClusterNode(h, p) for h, p in nodes[1:]]
    return {
        "url": first,
        "startup_nodes": startup,
        "socket_timeout": seconds,
        "socket_connect_timeout": seconds,
    }


def host_port(
    node: str, where: str, *, default: int = 6379, store: str = "redis cluster store"
) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; ``default`` when the port is left out) of a node
    that ``store``'s URL ``where`` names."""
    host, colon, port = node.strip().rpartition(":")
    if not colon or host.endswith(":"):
        host, port = node.strip(), str(default)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65_536:
        raise ConfigError(f"{store}: bad node {node!r} in {where}: write host:port")
    return host, int(port)


def netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe_client(client: Any) -> tuple[str, list[str]]:
    """How to name a client passed in, and its password to mask."""
    nodes = ",".join(node.name for node in client.get_nodes())
    kwargs = getattr(client.nodes_manager, "connection_kwargs", {}) or {}
    password = kwargs.get("password")
    return f"redis+cluster://{nodes}", [str(password)] if password else []


def pipelined(
    client: Any, lua: Lua, calls: list[Call], reads: Sequence[tuple[str, str]] = ()
) -> list[Any]:
    """Send each call of ``lua`` to the master of its keys' slot, in one cluster pipeline
    with an ``HGET`` of each ``(hash, field)`` of ``reads``: the replies, the calls' then
    the reads', errors among them."""
    pipe = client.pipeline()
    for keys, args in calls:
        # redis-py's cluster pipeline has no evalsha method, and would ask the server
        # for the keys of each command it cannot place; the master is named here from
        # the client's slot table (a MOVED reply sends the call on to the new one).
        master = client.get_node_from_key(keys[0])
        pipe.execute_command("EVALSHA", lua.sha, len(keys), *keys, *args, target_nodes=master)
    for key, field in reads:
        pipe.hget(key, field)
    return list(pipe.execute(raise_on_error=False))


def first_of_each_master(client: Any, key: Callable[[str], str]) -> list[str]:
    """One key per master, ``key(bucket)`` of the first bucket each master serves."""
    keys: dict[str, str] = {}
    for bucket in BUCKETS:
        named = key(bucket)
        keys.setdefault(client.get_node_from_key(named).name, named)
    return list(keys.values())
