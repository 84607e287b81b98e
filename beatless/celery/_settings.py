"""beatless settings of a Celery app, read once from ``app.conf``.

=================================  ==========================================================
``beatless_store_url``             The claim store. Default: the broker's own server when the
                                   broker is Redis (``redis://``, ``rediss://``, ``unix://``,
                                   ``redis+socket://``: atomic claim-and-enqueue), Redis
                                   Sentinel (``sentinel://``: the ``redis+sentinel://``
                                   store of the same sentinels and
                                   ``broker_transport_options["master_name"]``; two-phase)
                                   or RabbitMQ (``amqp://``, ``pyamqp://``: the RabbitMQ
                                   store, whose driver the ``rabbitmq`` extra installs);
                                   required with any other broker.
``beatless_namespace``             The namespace of every address. Default: ``app.main``
                                   (``Celery("proj")``); required when the app has no main
                                   name, unless the claim store is ``memory://``.
``beatless_max_late``              Default ``max_late`` of an entry. Default: the
                                   trigger's: 60 s, one hour for a one-off (``At``).
``beatless_jitter``                Default jitter window of an entry. Default: 0.
``beatless_catch_up``              Default catch-up policy of an entry: ``"latest"``
                                   (default), ``"all"`` or ``"none"``.
``beatless_overlap``               Default overlap policy of an entry: ``"allow"`` (default)
                                   or ``"skip"`` (no firing runs while a run of its
                                   address is in progress; counted ``skipped_overlap``).
``beatless_run_lease``             Default ``run_lease`` of an entry: how long a run's
                                   records outlive its last heartbeat (a worker killed
                                   mid-run frees them this long after). Default: 30 s.
``beatless_heartbeat``             Default ``heartbeat`` of an entry: how often a worker
                                   renews the records of a run in progress; under half the
                                   run lease. Default: 5 s.
``beatless_once_only``             Default ``once_only`` of an entry: a worker refuses a
                                   second copy of a firing it already runs or ran
                                   (counted ``duplicate``). Default: True.
``beatless_check_wait``            How long a worker's check of a firing (once-only,
                                   overlap ``skip``) waits for a claim store it cannot
                                   reach, trying again every 0.5 s, before it gives the
                                   check up (the task runs ``unchecked``, or is refused
                                   under ``skip``). 0: at the first failure. Default: 30 s.
``beatless_lease``                 Lease of a pending claim on the two-phase path. Default: 30 s.
``beatless_force_two_phase``       Claim, then ``send_task``, then commit, even on the broker's
                                   own Redis (keeps the publish signals). Default: False.
``beatless_preferred_claimer``     Each firing is claimed first by one node of the live
                                   registry (rendezvous hashing on its id), the others
                                   claiming only if it did not; off: every node claims every
                                   firing. Default: True.
``beatless_live``                  Each worker node also schedules the live entries written
                                   in the store (``beatless.live``); off: code entries only.
                                   Default: True.
``beatless_django``                Each worker node schedules django-celery-beat's rows too,
                                   one node a second reading what changed
                                   (:mod:`beatless.django`). Default: False.
``beatless_expires_from_lateness`` Give each message an ``expires`` at the end of its firing's
                                   lateness budget (jitter + max_late). Default: False.
``beatless_on_schedule_error``     ``"refuse"`` (default): a worker whose schedule has
                                   problems does not start. ``"consume"``: it consumes tasks
                                   and schedules nothing (see :mod:`beatless.schedule.problems`).
``beatless_metrics_port``          Serve the node's Prometheus metrics on this port
                                   (:mod:`beatless.ops.metrics`), from the worker's main process
                                   or the beat process. Default: none (needs the ``metrics``
                                   extra).
``beatless_metrics_host``          The address the metrics port listens on. Default:
                                   ``127.0.0.1`` (this host only); ``0.0.0.0`` for a
                                   Prometheus on another host.
``beatless_metrics_registry``      A prometheus_client ``CollectorRegistry`` to register the
                                   node's metrics in (and serve on the port), instead of
                                   prometheus_client's default registry.
=================================  ==========================================================

``timezone`` may be an IANA name, a ``zoneinfo.ZoneInfo``, a pytz zone,
``datetime.timezone.utc`` or a dateutil zone read from the tz database; anything else
(a fixed offset, the host's local zone) is refused, since nodes could disagree on it.
A bad setting is reported with every other bad setting at once.

Durations accept seconds, ``"90s"``, ``"2m"``, ISO 8601 ``"PT120S"`` or a ``timedelta``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, quote, urlsplit

from beatless.core.durations import as_timedelta
from beatless.core.triggers import zone
from beatless.core.urls import mask_url
from beatless.errors import ConfigError, ScheduleError
from beatless.node.dispatch import DEFAULT_LEASE
from beatless.node.runs import DEFAULT_CHECK_WAIT, check_wait
from beatless.ops.metrics import DEFAULT_ADDR, metrics_host, metrics_port, metrics_registry
from beatless.schedule.options import (
    DEFAULT_CATCH_UP,
    DEFAULT_HEARTBEAT,
    DEFAULT_OVERLAP,
    DEFAULT_RUN_LEASE,
    SHARED_NAMES,
    read_options,
    run_timing_problems,
)
from beatless.schedule.problems import REFUSE, on_schedule_error

if TYPE_CHECKING:
    from beatless.ops.metrics import CollectorRegistry

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+socket")
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379}
ON_SCHEDULE_ERROR_SETTING = "beatless_on_schedule_error"
METRICS_PORT_SETTING = "beatless_metrics_port"
METRICS_HOST_SETTING = "beatless_metrics_host"
METRICS_REGISTRY_SETTING = "beatless_metrics_registry"
CONSUME_WITH = f'app.conf.{ON_SCHEDULE_ERROR_SETTING} = "consume"'
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class CelerySettings:
    """The app-level beatless settings of one Celery app. Secrets are masked in ``repr``."""

    store_url: str = field(repr=False)
    broker_url: str = field(repr=False)
    namespace: str
    timezone: str
    max_late: timedelta | None = None
    """``None``: each entry takes its trigger's default."""
    jitter: timedelta = timedelta(0)
    catch_up: str = DEFAULT_CATCH_UP
    overlap: str = DEFAULT_OVERLAP
    run_lease: timedelta = DEFAULT_RUN_LEASE
    heartbeat: timedelta = DEFAULT_HEARTBEAT
    once_only: bool = True
    check_wait: timedelta = DEFAULT_CHECK_WAIT
    lease: timedelta = DEFAULT_LEASE
    force_two_phase: bool = False
    expires_from_lateness: bool = False
    preferred_claimer: bool = True
    live: bool = True
    on_schedule_error: str = REFUSE
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_ADDR
    metrics_registry: CollectorRegistry | None = None

    def __repr__(self) -> str:
        return (
            f"CelerySettings(store_url={mask_url(self.store_url)!r}, "
            f"broker_url={mask_url(self.broker_url)!r}, namespace={self.namespace!r}, "
            f"timezone={self.timezone!r}, max_late={self.max_late!r}, jitter={self.jitter!r}, "
            f"catch_up={self.catch_up!r}, overlap={self.overlap!r}, "
            f"run_lease={self.run_lease!r}, heartbeat={self.heartbeat!r}, "
            f"once_only={self.once_only!r}, check_wait={self.check_wait!r}, "
            f"lease={self.lease!r}, "
            f"force_two_phase={self.force_two_phase!r}, "
            f"expires_from_lateness={self.expires_from_lateness!r}, "
            f"preferred_claimer={self.preferred_claimer!r}, live={self.live!r}, "
            f"on_schedule_error={self.on_schedule_error!r}, "
            f"metrics_port={self.metrics_port!r}, metrics_host={self.metrics_host!r}, "
            f"metrics_registry={self.metrics_registry!r})"
        )

    @classmethod
    def from_app(cls, app: Any) -> CelerySettings:
        """Read and check the ``beatless_*`` settings of ``app.conf``: a
        :class:`~beatless.errors.ScheduleError` lists every bad setting at once."""
        conf = app.conf
        errors: list[str] = []

        def read(build: Callable[[], T], default: T) -> T:
            try:
                return build()
            except ConfigError as exc:
                errors.append(str(exc))
                return default

        given = {key: conf.get(f"beatless_{key}") for key in SHARED_NAMES}
        given = {key: value for key, value in given.items() if value is not None}
        broker_url = read(lambda: broker_write_url(app), "")
        store_url = read(lambda: _store_url(conf.get("beatless_store_url"), broker_url, app), "")
        settings = cls(
            store_url=store_url,
            broker_url=broker_url,
            namespace=read(lambda: _namespace(conf.get("beatless_namespace"), app, store_url), ""),
            timezone=read(lambda: app_timezone(app), "UTC"),
            **(options := read_options(given, lambda key: f"beatless_{key}", errors)),
            check_wait=read(lambda: _check_wait(conf), DEFAULT_CHECK_WAIT),
            lease=read(lambda: _duration(conf, "beatless_lease", DEFAULT_LEASE), DEFAULT_LEASE),
            force_two_phase=read(lambda: _flag(conf, "beatless_force_two_phase"), False),
            preferred_claimer=read(
                lambda: _flag(conf, "beatless_preferred_claimer", default=True), True
            ),
            live=read(lambda: _flag(conf, "beatless_live", default=True), True),
            expires_from_lateness=read(
                lambda: _flag(conf, "beatless_expires_from_lateness"), False
            ),
            on_schedule_error=read(lambda: on_schedule_error_of(app), REFUSE),
            metrics_port=read(lambda: _metrics_port(conf), None),
            metrics_host=read(lambda: _metrics_host(conf), DEFAULT_ADDR),
            metrics_registry=read(lambda: _metrics_registry(conf), None),
        )
        errors.extend(
            run_timing_problems(
                "",
                None if "run_lease" in given.keys() - options.keys() else settings.run_lease,
                None if "heartbeat" in given.keys() - options.keys() else settings.heartbeat,
                names=("beatless_run_lease", "beatless_heartbeat"),
            )
        )
        if errors:
            raise ScheduleError("; ".join(errors), errors)
        return settings

    @property
    def store_is_broker(self) -> bool:
        """Whether the claim store's URL names the broker's Redis (same server and db, as
        far as URLs tell). Only a first guess, for messages: the atomic path asks the
        servers themselves (``run_id`` and db), so a store URL spelt another way still
        takes it."""
        store = normalise_redis_url(self.store_url)
        return store is not None and store == normalise_redis_url(self.broker_url)

    @property
    def two_phase_reason(self) -> str | None:
        """Why no entry can be atomic, from the settings alone; ``None`` when the atomic
        path may be tried (both on Redis, not forced off)."""
        if self.force_two_phase:
            return "beatless_force_two_phase is set"
        if urlsplit(self.broker_url).scheme.lower() == "sentinel":
            return "the broker is Redis Sentinel (atomic on a plain Redis broker only)"
        if normalise_redis_url(self.broker_url) is None:
            return "the broker is not Redis"
        if normalise_redis_url(self.store_url) is None:
            return "the claim store is not the broker's Redis"
        return None

    @property
    def atomic(self) -> bool:
        """Whether claim and enqueue may be one step: both on Redis, not forced off (the
        servers decide whether the store is the broker's own)."""
        return self.two_phase_reason is None


def broker_write_url(app: Any) -> str:
    """The URL Celery publishes to: ``broker_write_url``, else the first ``broker_url``."""
    conf = app.conf
    url = conf.get("broker_write_url") or conf.get("broker_url")
    if not url:
        url = app.connection_for_write().as_uri(include_password=True)
    if isinstance(url, list | tuple):
        url = url[0]
    return str(url).split(";")[0].strip()


def on_schedule_error_of(app: Any) -> str:
    """``beatless_on_schedule_error``: ``"refuse"`` (the default) or ``"consume"``."""
    value = app.conf.get(ON_SCHEDULE_ERROR_SETTING)
    return REFUSE if value is None else on_schedule_error(value, name=ON_SCHEDULE_ERROR_SETTING)


def app_timezone(app: Any) -> str:
    """The IANA name of the app's time zone, as Celery decides it.

    ``timezone`` when set (a name or a zone object, see :func:`zone_name`); otherwise UTC
    when ``enable_utc`` (the default). With ``enable_utc = False`` and no ``timezone``,
    Celery uses the host's local zone, which may differ between nodes: beatless asks for
    an explicit ``timezone`` instead.
    """
    conf = app.conf
    configured = conf.get("timezone")
    if configured:
        name = zone_name(configured)
        if name is None:
            raise ConfigError(
                f"Celery timezone {configured!r}: beatless needs a zone with an IANA name "
                f"such as 'Europe/Berlin' (a name, a ZoneInfo, a pytz zone or "
                f"datetime.timezone.utc), so that every node agrees on it"
            )
        try:
            zone(name)
        except ConfigError as exc:
            raise ConfigError(f"Celery timezone: {exc}") from None
        return name
    if conf.get("enable_utc", True):
        return "UTC"
    raise ConfigError(
        "enable_utc is False and no timezone is set: Celery would use each host's local "
        "zone, and nodes could disagree; set app.conf.timezone to an IANA name"
    )


def zone_name(value: Any) -> str | None:
    """The IANA name of a time zone given as a name or a ``tzinfo``, else ``None``.

    Read: a ``str``; ``zoneinfo.ZoneInfo`` (``key``); a pytz zone (``zone``, pytz's UTC
    included); ``datetime.timezone.utc`` and dateutil's ``tzutc`` (``"UTC"``); a dateutil
    ``tzfile`` loaded from the tz database (the path below ``zoneinfo/``). A fixed offset
    other than UTC, a host's local zone or a zone loaded from elsewhere has no name
    every node would read alike: ``None``.
    """
    if isinstance(value, str):
        return value
    for attribute in ("key", "zone"):  # zoneinfo, pytz
        name = getattr(value, attribute, None)
        if isinstance(name, str) and name:
            return name
    is_utc = isinstance(value, timezone) and value.utcoffset(None) == timedelta(0)
    if is_utc or type(value).__name__ == "tzutc":  # the standard library's, dateutil's
        return "UTC"
    return _dateutil_name(value)


def _dateutil_name(value: Any) -> str | None:
    """The name of a dateutil ``tzfile`` read from the tz database, by its file's path."""
    filename = getattr(value, "_filename", None)
    if type(value).__name__ != "tzfile" or not isinstance(filename, str):
        return None
    if "/zoneinfo/" in filename:
        return filename.rpartition("/zoneinfo/")[2]
    if filename.startswith("/") or filename == "localtime":
        return None
    return filename  # from dateutil's own copy of the database, by name


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


AMQP_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")
"""Celery's spellings of a RabbitMQ broker: its default claim store is the RabbitMQ store."""


def _store_url(configured: Any, broker_url: str, app: Any) -> str:
    """``beatless_store_url``, else the store that follows the broker: a Redis broker's
    own Redis (atomic claim-and-enqueue), a RabbitMQ broker's own RabbitMQ (the RabbitMQ
    store: no other server needed)."""
    if configured:
        if not isinstance(configured, str):
            raise ConfigError(f"beatless_store_url must be a URL string, got {configured!r}")
        return configured
    scheme = urlsplit(broker_url).scheme.lower()
    if scheme in REDIS_SCHEMES:
        if scheme == "redis+socket":
            return "unix" + broker_url[len("redis+socket") :]
        return broker_url
    if scheme == "sentinel":
        return sentinel_store_url(app)
    if scheme in AMQP_SCHEMES:
        # kombu fills in what the URL leaves out (guest's password, the port) as it
        # connects; the store gets the same, under the plain AMQP spelling.
        full = urlsplit(str(app.connection_for_write().as_uri(include_password=True)))
        secure = scheme == "amqps" or full.scheme == "amqps"
        vhost = quote(full.path[1:] or "/", safe="")  # kombu writes the vhost "/" as "//"
        query = f"?{full.query}" if full.query else ""
        return f"{'amqps' if secure else 'amqp'}://{full.netloc}/{vhost}{query}"
    raise ConfigError(
        f"beatless_store_url is required with a {scheme or 'non-Redis'} broker "
        f"({mask_url(broker_url)}): set it to a claim store every node shares, e.g. "
        f"'redis://host:6379/0', 'postgresql://host/db' (or 'sqlite:///path' when all "
        f"nodes run on one host)"
    )


def sentinel_store_url(app: Any) -> str:
    """The ``redis+sentinel://`` store of a kombu ``sentinel://`` broker, read as kombu
    reads it: the sentinels of every ``sentinel://`` URL of the broker (port 26379 when
    left out); the master's user, password and db from the first; the service from
    ``broker_transport_options["master_name"]``; the sentinels' own password and user
    from its ``sentinel_kwargs``."""
    conf = app.conf
    given = conf.get("broker_write_url") or conf.get("broker_url") or ""
    urls = given if isinstance(given, list | tuple) else str(given).split(";")
    sentinels = [urlsplit(u.strip()) for u in urls if u.strip().lower().startswith("sentinel:")]
    options = conf.get("broker_transport_options") or {}
    service = options.get("master_name")
    if not sentinels or not isinstance(service, str) or not service:
        raise ConfigError(
            f"the broker {mask_url(str(urls[0]).strip())} is Redis Sentinel but "
            f"broker_transport_options has no 'master_name' (the service its sentinels "
            f"monitor): set it, as kombu needs it too, or set beatless_store_url to "
            f"'redis+sentinel://host:26379,host:26379/service_name/db'"
        )
    userinfo, at, _ = sentinels[0].netloc.rpartition("@")
    hosts = ",".join(parts.netloc.rpartition("@")[2] for parts in sentinels)
    db = sentinels[0].path.strip("/") or "0"
    own = options.get("sentinel_kwargs") or {}
    query = "&".join(
        f"sentinel_{key}={quote(str(own[key]), safe='')}"
        for key in ("username", "password")
        if own.get(key)
    )
    url = f"redis+sentinel://{userinfo}{at}{hosts}/{quote(service, safe='')}/{db}"
    return f"{url}?{query}" if query else url


def _namespace(configured: Any, app: Any, store_url: str) -> str:
    """``beatless_namespace``, else the app's main name.

    The namespace keeps two apps on one claim store apart, so its default must differ
    between apps and be the same on every node of one: ``Celery("proj")``'s main name
    is. An app with no main name (or ``"__main__"``, which depends on how the process
    was started) must set one, unless its store is ``memory://`` (one process)."""
    if configured is None:
        main = app.main
        if isinstance(main, str) and main and main != "__main__":
            return main
        if urlsplit(store_url).scheme.lower() == "memory":
            return "celery"
        raise ConfigError(
            f"beatless_namespace is required: the app has no main name ({main!r}), and two "
            f"apps on one claim store with the same entry names would claim each other's "
            f"firings; name the app (Celery('proj')) or set app.conf.beatless_namespace, "
            f"the same on every node of this app"
        )
    if not isinstance(configured, str) or not configured.strip() or "/" in configured:
        raise ConfigError(
            f"beatless_namespace must be a non-empty name without '/', got {configured!r}"
        )
    return configured


def _duration(conf: Any, key: str, default: timedelta) -> timedelta:
    value = conf.get(key)
    return default if value is None else as_timedelta(value, name=key)


def _check_wait(conf: Any) -> timedelta:
    value = conf.get("beatless_check_wait")
    return DEFAULT_CHECK_WAIT if value is None else check_wait(value, "beatless_check_wait")


def _metrics_port(conf: Any) -> int | None:
    value = conf.get(METRICS_PORT_SETTING)
    return None if value is None else metrics_port(value, METRICS_PORT_SETTING)


def _metrics_host(conf: Any) -> str:
    value = conf.get(METRICS_HOST_SETTING)
    return DEFAULT_ADDR if value is None else metrics_host(value, METRICS_HOST_SETTING)


def _metrics_registry(conf: Any) -> CollectorRegistry | None:
    value = conf.get(METRICS_REGISTRY_SETTING)
    return None if value is None else metrics_registry(value, METRICS_REGISTRY_SETTING)


def _flag(conf: Any, key: str, *, default: bool = False) -> bool:
    value = conf.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be True or False, got {value!r}")
    return value
