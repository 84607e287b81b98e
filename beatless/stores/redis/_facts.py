"""The settings of a Redis server that decide whether its claims survive (``CONFIG GET``,
or ``INFO`` where ``CONFIG`` is renamed), judged; and how full it is."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

from beatless.core._logtext import WarnEvery
from beatless.errors import StoreError, StoreFull
from beatless.stores.base import UNKNOWN, Fact, StoreFacts, Verdict
from beatless.stores.redis._wire import as_text

logger = logging.getLogger("beatless.stores.redis.store")
"""The store's logger, as before this module was split from it."""


def told_full(exc: StoreFull, usage: str | None, warned: WarnEvery) -> StoreFull:
    """``exc`` with ``usage`` (how full Redis is), said at WARNING at most once per
    ``FULL_WARN_EVERY_MS`` (``warned``: the store's own)."""
    told = f"{exc} ({usage})" if usage else str(exc)
    if warned.allows("full", FULL_WARN_EVERY_MS, int(time.monotonic() * 1_000)):
        logger.warning(
            "%s: Redis is full and refuses writes; claims are refused and their firings "
            "missed (reported) until it has room: raise maxmemory, free memory, or give "
            "the claim store a Redis of its own",
            told,
        )
    return StoreFull(told, usage=usage, kept=exc.kept)


def read_usage(client: Any, lost: tuple[type[BaseException], ...]) -> str | None:
    """How full Redis is (``INFO memory``, :func:`usage_of`); ``None`` when it cannot be
    read, tried twice: the first connection may be the one a refused call left unusable."""
    for _ in range(2):
        try:
            return usage_of(client.info("memory"))
        except lost:
            continue
    return None


SETTINGS = ("maxmemory-policy", "maxmemory", "appendonly", "save")
"""The settings :meth:`RedisStore.facts` reads with ``CONFIG GET``."""
INFO_SECTIONS = ("memory", "persistence", "replication")
"""The ``INFO`` sections it reads beside them, and falls back on when ``CONFIG`` is
renamed or disabled (managed Redis): ``maxmemory_policy``, ``maxmemory``,
``used_memory``, ``aof_enabled``, ``role``, ``connected_slaves``."""
EVICTING = ("allkeys-", "volatile-")
"""The prefixes of the ``maxmemory-policy`` values that evict keys. Claims carry a TTL,
so the ``volatile-*`` policies evict them as readily as ``allkeys-*``."""
NEARLY_FULL = 0.9
"""A Redis under ``noeviction`` this full (``used_memory / maxmemory``) is warned about."""
FULL_WARN_EVERY_MS = 60_000
"""A store that refuses writes as full says so at WARNING at most this often."""
FIX_POLICY = (
    "run CONFIG SET maxmemory-policy noeviction (and CONFIG REWRITE), or give the claim "
    "store a Redis of its own"
)


def read_settings(
    client: Any, errors: tuple[type[BaseException], ...]
) -> tuple[dict[str, str], dict[str, Any]]:
    """``CONFIG GET`` of each of ``SETTINGS`` and ``INFO`` of each of ``INFO_SECTIONS``,
    in one round trip: ``(config, info)``. A command refused (``CONFIG`` renamed) is left
    out of its dict; a connection that fails (``errors``) leaves both empty."""
    try:
        pipe = client.pipeline(transaction=False)
        for name in SETTINGS:
            pipe.config_get(name)
        for section in INFO_SECTIONS:
            pipe.info(section)
        replies = pipe.execute(raise_on_error=False)
    except errors:
        return {}, {}
    config: dict[str, str] = {}
    for reply in replies[: len(SETTINGS)]:
        if isinstance(reply, dict):
            config.update({as_text(k): as_text(v) for k, v in reply.items()})
    info: dict[str, Any] = {}
    for reply in replies[len(SETTINGS) :]:
        if isinstance(reply, dict):
            info.update({as_text(k): v for k, v in reply.items()})
    return config, info


POLICY_FORMS: dict[str, tuple[str, ...]] = {
    "named": ("CONFIG", "GET", "maxmemory-policy", "maxmemory"),
    "pattern": ("CONFIG", "GET", "maxmemory*"),
    "info": ("INFO", "memory"),
}
"""The commands that read ``maxmemory-policy`` and ``maxmemory``, by form, as
:func:`read_policy` tries them."""
POLICY_FRESH_MS = 500
"""How old a reading carried by a sync may be for :meth:`PolicyWatch.recent` to give it."""

Policy = tuple[object, "int | None"]
"""``maxmemory-policy`` (as Redis said it) and ``maxmemory``."""


def read_policy(
    client: Any, driver: ModuleType, errors: tuple[type[BaseException], ...]
) -> Policy | None:
    """``maxmemory-policy`` and ``maxmemory`` in one command: ``CONFIG GET`` of both by name
    (Redis 7: two lookups, where the pattern ``maxmemory*`` of an earlier Redis, which
    takes one name only, matches every setting against it: ten times the server's time),
    or ``INFO memory`` where ``CONFIG`` is refused (renamed, or not granted); ``None`` if
    neither answers."""
    found = _read_policy(client, driver, errors)
    return None if found is None else found[0]


def _read_policy(
    client: Any, driver: ModuleType, errors: tuple[type[BaseException], ...]
) -> tuple[Policy, str] | None:
    """:func:`read_policy`, with the form that answered (a key of :data:`POLICY_FORMS`)."""
    try:
        for form in ("named", "pattern", "info"):
            try:
                return policy_of(form, client.execute_command(*POLICY_FORMS[form])), form
            except driver.exceptions.ResponseError:  # Redis before 7, or CONFIG refused
                continue
    except errors:
        return None
    return None


def policy_of(form: str, reply: Any) -> Policy:
    """The policy and ``maxmemory`` in the reply of the command of ``form``."""
    if form == "info":
        return reply.get("maxmemory_policy"), _number(reply.get("maxmemory"))
    config = {as_text(k): v for k, v in _pairs(reply)}
    return config.get("maxmemory-policy"), _number(config.get("maxmemory"))


class PolicyWatch:
    """The policy of one Redis as a node's syncs read it: its reading rides in the sync's
    own pipeline (:meth:`queue`, :meth:`took`), one round trip fewer a second, in the form
    a direct read (:meth:`read`) found to answer; :meth:`recent` gives it for
    :data:`POLICY_FRESH_MS`, so the judgement just after a sync needs no command of its
    own. A reading that fails forgets the form: the next one is direct again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.form: str | None = None
        self._read: tuple[Policy, float] | None = None

    def read(
        self, client: Any, driver: ModuleType, errors: tuple[type[BaseException], ...]
    ) -> Policy | None:
        """A direct read (:func:`read_policy`), whose form later syncs carry."""
        found = _read_policy(client, driver, errors)
        if found is None:
            self.form = None
            return None
        policy, self.form = found
        return policy

    def queue(self, pipe: Any) -> bool:
        """Queue the read on ``pipe`` if a direct read found its form; whether it did."""
        if self.form is None:
            return False
        pipe.execute_command(*POLICY_FORMS[self.form])
        return True

    def took(self, reply: Any) -> None:
        """The reply of the read :meth:`queue` queued (an exception if it failed)."""
        if self.form is None or isinstance(reply, Exception):
            self.form, self._read = None, None
            return
        self._read = policy_of(self.form, reply), self.clock() * 1_000

    def recent(self) -> Policy | None:
        """The reading a sync took less than :data:`POLICY_FRESH_MS` ago; else ``None``."""
        if self._read is None or self.clock() * 1_000 - self._read[1] > POLICY_FRESH_MS:
            return None
        return self._read[0]


def _pairs(found: Any) -> list[tuple[Any, Any]]:
    """A ``CONFIG GET`` reply as pairs: a dict (redis-py's parsed reply) or a flat list."""
    if isinstance(found, dict):
        return list(found.items())
    return list(zip(found[::2], found[1::2], strict=True))


def judge_settings(store: str, config: dict[str, str], info: dict[str, Any]) -> StoreFacts:
    """The facts of one Redis server from what :func:`read_settings` read."""
    maxmemory = _number(config.get("maxmemory", info.get("maxmemory")))
    facts = (
        policy_fact(config.get("maxmemory-policy", info.get("maxmemory_policy")), maxmemory),
        _maxmemory_fact(maxmemory, _number(info.get("used_memory")), config, info),
        *_persistence_facts(config, info),
        *_replication_facts(info),
    )
    return StoreFacts(store, facts, usage=usage_of(info, maxmemory))


def policy_fact(policy: object, maxmemory: int | None) -> Fact:
    name = "maxmemory-policy"
    if policy is None:
        why = "could not be read (CONFIG and INFO refused): make sure it is noeviction"
        return Fact(name, UNKNOWN, Verdict.WARN, why)
    value = as_text(policy)
    if not value.startswith(EVICTING):
        return Fact(name, value)
    if maxmemory == 0:
        why = (
            "evicts keys, claims included, once a maxmemory is set (none is: nothing is "
            f"evicted now, and a limit set later is noticed within a second); {FIX_POLICY}"
        )
        return Fact(name, value, Verdict.WARN, why)
    why = (
        "Redis evicts keys when its memory is full, claims included (they carry a TTL, so "
        "volatile-* policies evict them too), and a firing whose claim was evicted is sent "
        f"again; {FIX_POLICY}"
    )
    return Fact(name, value, Verdict.REFUSE, why)


def _maxmemory_fact(
    maxmemory: int | None, used: int | None, config: dict[str, str], info: dict[str, Any]
) -> Fact:
    if maxmemory is None:
        return Fact("maxmemory", UNKNOWN, Verdict.WARN, "could not be read")
    if maxmemory == 0:
        return Fact("maxmemory", "0 (no limit)")
    value = _size(maxmemory)
    policy = as_text(config.get("maxmemory-policy", info.get("maxmemory_policy", "")))
    if used is not None and used >= NEARLY_FULL * maxmemory and not policy.startswith(EVICTING):
        why = (
            f"used_memory {_size(used)} is {used / maxmemory:.0%} of it: a full Redis refuses "
            "claims, and their firings are missed (reported); raise maxmemory or free memory"
        )
        return Fact("maxmemory", value, Verdict.WARN, why)
    return Fact("maxmemory", value)


def _persistence_facts(config: dict[str, str], info: dict[str, Any]) -> list[Fact]:
    aof = config.get("appendonly")
    if aof is None and "aof_enabled" in info:
        aof = "yes" if _number(info["aof_enabled"]) else "no"
    save = config.get("save")
    saved = Fact("save", UNKNOWN if save is None else repr(save))
    if aof == "yes":
        return [Fact("appendonly", aof), saved]
    if aof is None:
        why = "could not be read: a Redis without persistence forgets every claim on restart"
        return [Fact("appendonly", UNKNOWN, Verdict.WARN, why), saved]
    lost = (
        "every claim"
        if save == ""
        else "the claims written since the last snapshot"
        if save
        else "the claims written since the last snapshot, if it saves any"
    )
    why = (
        f"a restart forgets {lost}: firings released up to then are not sent again, they "
        "are reported forgotten (missed); appendonly yes keeps them"
    )
    return [Fact("appendonly", aof, Verdict.WARN, why), saved]


def _replication_facts(info: dict[str, Any]) -> list[Fact]:
    role = info.get("role")
    if role is None:
        return [Fact("role", UNKNOWN, Verdict.WARN, "could not be read (INFO replication)")]
    role = as_text(role)
    if role != "master":
        why = "a replica: claims must be written on the primary; point the URL at it"
        return [Fact("role", role, Verdict.REFUSE, why)]
    replicas = _number(info.get("connected_slaves")) or 0
    if not replicas:
        return [Fact("role", role), Fact("connected replicas", "0")]
    why = (
        "replication is asynchronous: a replica promoted by a failover may lack the last "
        "claims; firings released up to the failover that nobody holds there are reported "
        "forgotten (missed), not sent again; wait=1 in the store URL makes each claim wait "
        "for a replica"
    )
    return [Fact("role", role), Fact("connected replicas", str(replicas), Verdict.WARN, why)]


def usage_of(info: dict[str, Any], maxmemory: int | None = None) -> str | None:
    """``used_memory 7.9 MiB of maxmemory 8.0 MiB (99%)`` from ``INFO memory``; ``None``
    when it has no ``used_memory``."""
    used = _number(info.get("used_memory"))
    limit = _number(info.get("maxmemory")) if maxmemory is None else maxmemory
    if used is None:
        return None
    if not limit:
        return f"used_memory {_size(used)}, no maxmemory"
    return f"used_memory {_size(used)} of maxmemory {_size(limit)} ({used / limit:.0%})"


def _number(value: object) -> int | None:
    if isinstance(value, int):
        return value
    text = as_text(value) if value is not None else ""
    return int(text) if text.isdigit() else None


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} GiB"


def is_oom(error: BaseException) -> bool:
    """Whether a Redis error is a write refused because memory is full (``OOM command
    not allowed``, also when raised inside a script)."""
    oom = getattr(getattr(type(error), "__module__", None), "startswith", None)
    named = type(error).__name__ == "OutOfMemoryError" and oom is not None and oom("redis")
    return named or "command not allowed when used memory" in str(error)


def with_wait(facts: StoreFacts, info: dict[str, Any], wait: int, timeout_ms: int) -> StoreFacts:
    """``facts`` of a store whose claims wait for ``wait`` replicas: too few connected is a
    refusal (every claim would time out); enough is no longer a warning."""
    replicas = _number(info.get("connected_slaves"))
    if replicas is None:
        return facts
    asked = Fact("wait", f"{wait} replica(s) within {timeout_ms} ms")
    if replicas < wait:
        why = (
            f"wait={wait} asks {wait} replica(s) to acknowledge each claim and {replicas} "
            "is connected: every claim would time out; start a replica, or drop wait from "
            "the store URL"
        )
        got = Fact("connected replicas", str(replicas), Verdict.REFUSE, why)
    else:
        got = Fact("connected replicas", str(replicas))
    kept = tuple(f for f in facts.facts if f.name != "connected replicas")
    return replace(facts, facts=(*kept, got, asked))


def primaries_usage(client: Any) -> str | None:
    """How full each primary of a cluster is (``INFO memory``), for a full store's error;
    ``None`` when none says."""
    usages: list[str] = []
    for primary in client.get_primaries():
        usage = usage_of(client.get_redis_connection(primary).info("memory"))
        usages += [f"{primary.host}:{primary.port} {usage}"] if usage else []
    return "; ".join(usages) or None


def evicts(facts: StoreFacts) -> bool:
    """Whether ``facts`` refuse a server's eviction policy (on a Redis Cluster, any
    primary's): its memory may be full, and its claims evicted, already."""
    return any(
        fact.verdict is Verdict.REFUSE and fact.name.split(" @", 1)[0] == "maxmemory-policy"
        for fact in facts.facts
    )


class EvictedEpoch:
    """What a running store object does when its settings turn to an evicting policy.

    The claims stop within a sync (the refusal), but the claims made before then may be
    evicted already, or until the policy is fixed, and a firing whose claim was evicted
    would be won again once the claims resume. So while a store object that started on
    good settings finds its server evicting, every watch begins its epoch record(s) again
    with the cause ``evicted`` (``epochs.lua``). The claims after that judge the firings
    released before the new epoch's start plus the tolerance that nobody holds as on a
    store that lost its memory: held off while the nodes write back what they sent, or
    forgotten (written committed, reported, not sent); a node started since, which saw
    no epoch before, forgets them, as after a failover (``claim.lua``, "Eviction")."""

    def __init__(self) -> None:
        self.dropping = False
        """Whether the epoch was begun again since the policy turned evicting."""

    def after_watch(
        self, running: bool, facts: StoreFacts, drop: Callable[[], None], label: str
    ) -> None:
        """``running``: a watch had read the facts before this one; ``drop``: begin the
        epoch record(s) again, raising :class:`~beatless.errors.StoreError` if it could
        not (tried again at the next watch)."""
        if not (running and evicts(facts)):
            self.dropping = False
            return
        try:
            drop()
        except StoreError as exc:
            logger.debug("%s: epoch not begun again: %s", label, exc)
            return
        if not self.dropping:
            self.dropping = True
            logger.warning(
                "%s: its maxmemory-policy evicts keys, and the claims made before the nodes "
                "stopped claiming may be evicted: its epoch is begun again while the policy "
                "holds, so that once the claims resume, the firings released before the new "
                "epoch's start + 10 s that nobody holds are written back by the nodes that "
                "sent them, or reported forgotten, not sent again",
                label,
            )
