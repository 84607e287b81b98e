"""The options of the Dramatiq middleware, checked once when it is made.

:class:`DramatiqSettings` holds what ``Beatless(...)`` was given, converted (durations
are :class:`~datetime.timedelta`, policies their canonical names) and checked: a bad
option raises :class:`~beatless.errors.ConfigError` naming it, from the constructor.
``jitter``, ``max_late``, ``catch_up``, ``overlap``, ``run_lease``, ``heartbeat`` and
``once_only`` are the defaults of the actors' ``periodic`` declarations
(:meth:`DramatiqSettings.entry_defaults`). The namespace of the addresses is
:attr:`DramatiqSettings.address_namespace`: required with any store but the memory store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from beatless.core.durations import DurationLike, as_timedelta
from beatless.core.triggers import zone
from beatless.core.urls import mask_url
from beatless.errors import ConfigError
from beatless.node.runs import check_wait as _check_wait
from beatless.ops import metrics as exported
from beatless.schedule.entry import Entry
from beatless.schedule.options import BY_NAME, SHARED_NAMES
from beatless.schedule.problems import on_schedule_error
from beatless.stores.memory import MemoryStore

if TYPE_CHECKING:
    from beatless.ops.metrics import CollectorRegistry

MEMORY_NAMESPACE = "default"
"""The namespace of a middleware on the memory store (one process) that names none."""
CONSUME_WITH = 'Beatless(..., on_schedule_error="consume")'
"""How to keep consuming despite problems, as the refusal says it."""


@dataclass(frozen=True, kw_only=True)
class DramatiqSettings:
    """The checked options of one ``Beatless`` middleware (see its docstring for each).
    Make it with :meth:`of`, which converts and checks them."""

    store: Any
    entries: tuple[Entry, ...]
    namespace: str | None
    timezone: str
    jitter: timedelta
    max_late: timedelta | None
    """``None``: each entry takes its trigger's default (60 s, an hour for a one-off)."""
    catch_up: str
    overlap: str
    run_lease: timedelta
    heartbeat: timedelta
    once_only: bool
    check_wait: timedelta
    lease: timedelta
    tenant_kwarg: str | None
    on_schedule_error: str
    node: str | None
    clock: Callable[[], float]
    metrics: bool | CollectorRegistry
    metrics_port: int | None
    metrics_host: str
    preferred_claimer: bool
    live: bool

    @classmethod
    def of(
        cls,
        *,
        store: Any,
        entries: Iterable[Entry],
        namespace: str | None,
        timezone: str,
        jitter: DurationLike,
        max_late: DurationLike | None,
        catch_up: str,
        overlap: str,
        run_lease: DurationLike,
        heartbeat: DurationLike,
        once_only: bool,
        check_wait: DurationLike,
        lease: DurationLike,
        tenant_kwarg: str | None,
        on_schedule_error: str,
        node: str | None,
        clock: Callable[[], float],
        metrics: bool | CollectorRegistry,
        metrics_port: int | None,
        metrics_host: str,
        preferred_claimer: bool,
        live: bool = True,
    ) -> DramatiqSettings:
        """The options, as ``Beatless(...)`` was given them (its signature holds the
        defaults), converted and checked in that order: the first bad one raises
        :class:`~beatless.errors.ConfigError`, naming it."""
        return cls(
            store=store,
            entries=_entries(entries),
            namespace=_namespace(namespace),
            timezone=_timezone(timezone),
            jitter=_option("jitter", jitter),
            max_late=_option("max_late", max_late),
            catch_up=_option("catch_up", catch_up),
            overlap=_option("overlap", overlap),
            run_lease=_option("run_lease", run_lease),
            heartbeat=_option("heartbeat", heartbeat),
            once_only=_option("once_only", once_only),
            check_wait=_check_wait(check_wait, "Beatless: check_wait"),
            lease=as_timedelta(lease, name="Beatless: lease"),
            tenant_kwarg=tenant_kwarg,
            on_schedule_error=_on_schedule_error(on_schedule_error),
            node=node,
            clock=clock,
            metrics=_metrics(metrics),
            metrics_port=None
            if metrics_port is None
            else exported.metrics_port(metrics_port, "Beatless: metrics_port"),
            metrics_host=exported.metrics_host(metrics_host, "Beatless: metrics_host"),
            preferred_claimer=_flag(preferred_claimer, "preferred_claimer"),
            live=_flag(live, "live"),
        )

    @property
    def address_namespace(self) -> str:
        """The namespace of every address: ``namespace``, or ``"default"`` on the memory
        store; a :class:`~beatless.errors.ConfigError` for a shared store without one."""
        if self.namespace is not None:
            return self.namespace
        if self.on_memory:
            return MEMORY_NAMESPACE
        raise ConfigError(
            f"Beatless: namespace is required with the claim store {self.where}: two apps on "
            f"one store with the same entry names would claim each other's firings; give "
            f'Beatless(namespace="myapp"), the same on every node of this app (nodes that '
            f'ran without one used "default": give namespace="default" to keep their ids)'
        )

    @property
    def on_memory(self) -> bool:
        """Whether the claim store is the memory store (one process)."""
        if isinstance(self.store, str):
            return urlsplit(self.store).scheme.lower() == "memory"
        return isinstance(self.store, MemoryStore)

    @property
    def where(self) -> str:
        """The claim store as an error names it (a URL masked)."""
        if self.store is None:
            return "of the broker's own server"
        return mask_url(self.store) if isinstance(self.store, str) else type(self.store).__name__

    def entry_defaults(self) -> dict[str, Any]:
        """The defaults of the actors' ``periodic`` declarations, as keywords of
        :meth:`Periodic.entry <beatless.dramatiq._periodic.Periodic.entry>` (an entry's
        window has none: it is the entry's own)."""
        return {name: getattr(self, name) for name in SHARED_NAMES}


def _entries(entries: Iterable[Entry]) -> tuple[Entry, ...]:
    given = tuple(entries)
    for entry in given:
        if not isinstance(entry, Entry):
            raise ConfigError(f"Beatless entries must be Entry values, got {entry!r}")
    return given


def _namespace(namespace: str | None) -> str | None:
    if namespace is not None and (
        not isinstance(namespace, str) or not namespace.strip() or "/" in namespace
    ):
        raise ConfigError(f"Beatless: namespace must be a name without '/', got {namespace!r}")
    return namespace


def _timezone(timezone: str) -> str:
    zone(timezone)
    return timezone


def _flag(value: bool, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"Beatless: {name} must be true or false, got {value!r}")
    return value


def _on_schedule_error(value: str) -> str:
    return on_schedule_error(value, name="Beatless: on_schedule_error")


def _metrics(metrics: bool | CollectorRegistry) -> bool | CollectorRegistry:
    if metrics is True:
        exported.require()
    elif metrics is not False:
        metrics = exported.metrics_registry(metrics, "Beatless: metrics")
    return metrics


def _option(name: str, value: object) -> Any:
    """An entry option's default as the middleware was given it, read as every place that
    takes entry options reads it (:mod:`beatless.schedule.options`)."""
    return BY_NAME[name].value(value, "Beatless")
