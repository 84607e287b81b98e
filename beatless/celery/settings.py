"""beatless settings of a Celery app, read once from ``app.conf``.

=================================  ==========================================================
``beatless_store_url``             The claim store. Default: the broker URL when the broker is
                                   Redis (``redis://``, ``rediss://``, ``unix://``,
                                   ``redis+socket://``); required with any other broker.
``beatless_namespace``             The namespace of every address. Default: ``app.main``, or
                                   ``"celery"`` when the app has no main name.
``beatless_max_late``              Default ``max_late`` of an entry. Default: 60 s.
``beatless_jitter``                Default jitter window of an entry. Default: 0.
``beatless_lease``                 Lease of a pending claim on the two-phase path. Default: 30 s.
``beatless_force_two_phase``       Claim, then ``send_task``, then commit, even on the broker's
                                   own Redis (keeps the publish signals). Default: False.
``beatless_expires_from_lateness`` Give each message an ``expires`` at the end of its firing's
                                   lateness budget (jitter + max_late). Default: False.
=================================  ==========================================================

Durations accept seconds, ``"90s"``, ``"2m"``, ISO 8601 ``"PT120S"`` or a ``timedelta``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from beatless.durations import as_timedelta
from beatless.entry import DEFAULT_MAX_LATE
from beatless.errors import ConfigError
from beatless.urls import mask_url

DEFAULT_LEASE = timedelta(seconds=30)
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+socket")
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379}


@dataclass(frozen=True, kw_only=True)
class CelerySettings:
    """The app-level beatless settings of one Celery app. Secrets are masked in ``repr``."""

    store_url: str = field(repr=False)
    broker_url: str = field(repr=False)
    namespace: str
    timezone: str
    max_late: timedelta = DEFAULT_MAX_LATE
    jitter: timedelta = timedelta(0)
    lease: timedelta = DEFAULT_LEASE
    force_two_phase: bool = False
    expires_from_lateness: bool = False

    def __repr__(self) -> str:
        return (
            f"CelerySettings(store_url={mask_url(self.store_url)!r}, "
            f"broker_url={mask_url(self.broker_url)!r}, namespace={self.namespace!r}, "
            f"timezone={self.timezone!r}, max_late={self.max_late!r}, jitter={self.jitter!r}, "
            f"lease={self.lease!r}, force_two_phase={self.force_two_phase!r}, "
            f"expires_from_lateness={self.expires_from_lateness!r})"
        )

    @classmethod
    def from_app(cls, app: Any) -> CelerySettings:
        """Read and check the ``beatless_*`` settings of ``app.conf``."""
        conf = app.conf
        broker_url = broker_write_url(app)
        return cls(
            store_url=_store_url(conf.get("beatless_store_url"), broker_url),
            broker_url=broker_url,
            namespace=_namespace(conf.get("beatless_namespace"), app.main),
            timezone=app_timezone(app),
            max_late=_duration(conf, "beatless_max_late", DEFAULT_MAX_LATE),
            jitter=_duration(conf, "beatless_jitter", timedelta(0)),
            lease=_duration(conf, "beatless_lease", DEFAULT_LEASE),
            force_two_phase=_flag(conf, "beatless_force_two_phase"),
            expires_from_lateness=_flag(conf, "beatless_expires_from_lateness"),
        )

    @property
    def store_is_broker(self) -> bool:
        """Whether the claim store is the broker's own Redis (same server and db)."""
        store = normalise_redis_url(self.store_url)
        return store is not None and store == normalise_redis_url(self.broker_url)

    @property
    def atomic(self) -> bool:
        """Whether claim and enqueue may be one step: the broker's own Redis, not forced off."""
        return self.store_is_broker and not self.force_two_phase


def broker_write_url(app: Any) -> str:
    """The URL Celery publishes to: ``broker_write_url``, else the first ``broker_url``."""
    conf = app.conf
    url = conf.get("broker_write_url") or conf.get("broker_url")
    if not url:
        url = app.connection_for_write().as_uri(include_password=True)
    if isinstance(url, list | tuple):
        url = url[0]
    return str(url).split(";")[0].strip()


def app_timezone(app: Any) -> str:
    """The IANA name of the app's time zone, as Celery decides it.

    ``timezone`` when set; otherwise UTC when ``enable_utc`` (the default). With
    ``enable_utc = False`` and no ``timezone``, Celery uses the host's local zone, which
    may differ between nodes: beatless asks for an explicit ``timezone`` instead.
    """
    conf = app.conf
    configured = conf.get("timezone")
    if configured:
        name = getattr(configured, "key", configured)
        if not isinstance(name, str):
            raise ConfigError(
                f"Celery timezone {configured!r}: beatless needs an IANA name such as "
                f"'Europe/Berlin' so that every node agrees on it"
            )
        return name
    if conf.get("enable_utc", True):
        return "UTC"
    raise ConfigError(
        "enable_utc is False and no timezone is set: Celery would use each host's local "
        "zone, and nodes could disagree; set app.conf.timezone to an IANA name"
    )


def normalise_redis_url(url: str) -> tuple[str, str, int, int] | None:
    """``(kind, host or socket path, port, db)`` for a Redis URL, ``None`` for others.

    ``localhost`` and ``127.0.0.1`` are the same host; credentials are not compared.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in REDIS_SCHEMES:
        return None
    query = dict(parse_qsl(parts.query))
    if scheme in ("unix", "redis+socket"):
        return ("unix", parts.path, 0, _db(query.get("db") or query.get("virtual_host"), url))
    host = (parts.hostname or "localhost").lower()
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    db = parts.path.strip("/") or query.get("db")
    return (scheme, host, parts.port or _DEFAULT_PORTS[scheme], _db(db, url))


def _db(value: str | None, url: str) -> int:
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"Redis URL {mask_url(url)!r}: the db must be a number") from None


def _store_url(configured: Any, broker_url: str) -> str:
    if configured:
        if not isinstance(configured, str):
            raise ConfigError(f"beatless_store_url must be a URL string, got {configured!r}")
        return configured
    scheme = urlsplit(broker_url).scheme.lower()
    if scheme in REDIS_SCHEMES:
        if scheme == "redis+socket":
            return "unix" + broker_url[len("redis+socket") :]
        return broker_url
    raise ConfigError(
        f"beatless_store_url is required with a {scheme or 'non-Redis'} broker "
        f"({mask_url(broker_url)}): set it to a claim store every node shares, e.g. "
        f"'redis://host:6379/0' (or 'sqlite:///path' when all nodes run on one host)"
    )


def _namespace(configured: Any, main: str | None) -> str:
    if configured is None:
        return main or "celery"
    if not isinstance(configured, str) or not configured.strip() or "/" in configured:
        raise ConfigError(
            f"beatless_namespace must be a non-empty name without '/', got {configured!r}"
        )
    return configured


def _duration(conf: Any, key: str, default: timedelta) -> timedelta:
    value = conf.get(key)
    return default if value is None else as_timedelta(value, name=key)


def _flag(conf: Any, key: str) -> bool:
    value = conf.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be True or False, got {value!r}")
    return value
