"""Prometheus metrics of this process's schedulers, computed when they are scraped::

    import beatless.ops.metrics

    beatless.ops.metrics.register(scheduler)   # into prometheus_client's default registry
    beatless.ops.metrics.serve(9808)           # its HTTP exposition, in a daemon thread

A scheduler already keeps what an operator watches: its counters and release lateness
per entry (:mod:`beatless.node.stats`), its clock offset to the claim store, the registry of
live nodes its board last read. So the collector adds nothing to the loop: at each
scrape it reads those, and computes each entry's next release. One collector per
registry serves every scheduler registered in it; each series carries the ``namespace``
and ``node`` of its scheduler. The metrics and example alerts are in
``docs/operations.md``.

prometheus-client is an extra (``beatless[metrics]``), imported only when it is used:
importing this module needs nothing.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from beatless.core._drivers import missing
from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.triggers import Trigger, occurrence_key
from beatless.errors import ConfigError
from beatless.node.stats import BUCKETS_MS, EntryStats, Histogram
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.firing import offset_ms

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.metrics_core import Metric

    # Re-exported (mypy's explicit form) for the integrations' annotations, so that they
    # import no prometheus_client of their own.
    from prometheus_client.registry import CollectorRegistry as CollectorRegistry  # noqa: PLC0414

    from beatless.node._view import NodeView

__all__ = [
    "DEFAULT_ADDR",
    "OUTCOMES",
    "SchedulerCollector",
    "metrics_host",
    "metrics_port",
    "metrics_registry",
    "publish",
    "register",
    "require",
    "serve",
    "unregister",
]

logger = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1"
"""Where :func:`serve` listens unless told: this host only, as the status page does. A
Prometheus on another host needs the node's own address, or ``0.0.0.0`` (every
interface): ``beatless_metrics_host``, ``Beatless(metrics_host=...)``,
``beatless run --metrics-host``."""
MAX_PORT = 65_535

NODE_LABELS = ("namespace", "node")
ENTRY_LABELS = (*NODE_LABELS, "entry")

OUTCOMES = tuple(
    name
    for name, value in EntryStats().as_dict().items()
    if isinstance(value, int) and not name.startswith("lateness")
)
"""The ``outcome`` labels of ``beatless_firings_total``: every counter of
:meth:`EntryStats.as_dict <beatless.node.stats.EntryStats.as_dict>` (its lateness summary
aside), so that a counter added there is exported too."""

LATENESS_BOUNDS = (*(str(ms / 1_000) for ms in BUCKETS_MS), "+Inf")
"""The ``le`` labels of the lateness histogram: :data:`~beatless.node.stats.BUCKETS_MS` in
seconds, written as prometheus_client writes a bucket's bound."""


def require() -> None:
    """A :class:`~beatless.errors.ConfigError` saying what to install, unless
    prometheus-client is installed."""
    problem = missing("prometheus_client", "beatless metrics")
    if problem is not None:
        raise ConfigError(problem)


@dataclass(frozen=True, slots=True)
class _Families:
    """The metric families of one scrape, filled scheduler by scheduler."""

    firings: CounterMetricFamily
    lateness: HistogramMetricFamily
    missed: CounterMetricFamily
    live_nodes: GaugeMetricFamily
    fingerprints: GaugeMetricFamily
    tzdata_versions: GaugeMetricFamily
    round_trip: GaugeMetricFamily
    clock_offset: GaugeMetricFamily
    next_release: GaugeMetricFamily
    loop_alive: GaugeMetricFamily
    last_wake: GaugeMetricFamily
    skipped_notes: CounterMetricFamily
    live_revision: GaugeMetricFamily
    live_applied: GaugeMetricFamily

    @classmethod
    def empty(cls) -> _Families:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=NODE_LABELS)

        return cls(
            firings=CounterMetricFamily(
                "beatless_firings",
                "Firings this node decided, by entry and outcome (the counters of beatless status)",
                labels=(*ENTRY_LABELS, "outcome"),
            ),
            lateness=HistogramMetricFamily(
                "beatless_release_lateness_seconds",
                "From a firing's release to its enqueue, for the firings this node won",
                labels=ENTRY_LABELS,
            ),
            missed=CounterMetricFamily(
                "beatless_missed_firings",
                "Firings no node claimed in time, counted once in the fleet by the node "
                "that found them",
                labels=ENTRY_LABELS,
            ),
            live_nodes=gauge(
                "beatless_live_nodes", "Live nodes in the registry, as this node last read it"
            ),
            fingerprints=gauge(
                "beatless_schedule_fingerprints",
                "Distinct schedule fingerprints among the live nodes: over 1 is drift",
            ),
            tzdata_versions=gauge(
                "beatless_tzdata_versions", "Distinct tzdata versions among the live nodes"
            ),
            round_trip=gauge(
                "beatless_store_round_trip_seconds",
                "Round trip to the claim store of the sample the clock offset was taken from",
            ),
            clock_offset=gauge(
                "beatless_clock_offset_seconds", "The claim store's clock minus this node's"
            ),
            next_release=GaugeMetricFamily(
                "beatless_next_release_timestamp_seconds",
                "When the entry's next firing is released (a fan-out entry: its next "
                "occurrence), in epoch seconds",
                labels=ENTRY_LABELS,
            ),
            loop_alive=gauge(
                "beatless_loop_alive", "1 while this node's scheduler loop runs, 0 once it stopped"
            ),
            last_wake=gauge(
                "beatless_loop_last_wake_timestamp_seconds",
                "When this node's scheduler loop last woke (it wakes at least every second), "
                "in epoch seconds on the node's clock",
            ),
            skipped_notes=CounterMetricFamily(
                "beatless_skipped_notes",
                "Notes this node read from the claim store that did not fit the schema of "
                "their kind and were skipped, each counted once, by kind",
                labels=(*NODE_LABELS, "kind"),
            ),
            live_revision=gauge(
                "beatless_live_revision",
                "The live revision this node applied (0: none yet); nodes that differ for "
                "more than a few seconds are behind",
            ),
            live_applied=gauge(
                "beatless_live_applied_seconds",
                "Seconds from the commit of the last live revision to this node applying it, "
                "on the store's clock",
            ),
        )

    def __iter__(self) -> Iterator[Metric]:
        return (getattr(self, field.name) for field in fields(self))

    def add(self, scheduler: NodeView) -> None:
        """The series of one scheduler."""
        node = [scheduler.schedule.namespace, scheduler.node]
        releases = _next_releases(scheduler.schedule, scheduler.now_ms())
        for name, stats in scheduler.stats.items():
            entry = [*node, name]
            for outcome in OUTCOMES:
                self.firings.add_metric([*entry, outcome], getattr(stats, outcome))
            self.missed.add_metric(entry, stats.missed)
            self.lateness.add_metric(entry, _buckets(stats.lateness), stats.lateness.sum_ms / 1_000)
            release = releases.get(name)
            if release is not None:
                self.next_release.add_metric(entry, release / 1_000)
        records = scheduler.board.registry
        if records:  # empty until the board first reads the registry
            self.live_nodes.add_metric(node, len(records))
            self.fingerprints.add_metric(node, len({r.fingerprint for r in records}))
            self.tzdata_versions.add_metric(node, len({r.tzdata for r in records}))
        watch = scheduler.clockwatch
        if watch.offset_ms is not None:
            self.clock_offset.add_metric(node, watch.offset_ms / 1_000)
        if watch.round_trip_ms is not None:
            self.round_trip.add_metric(node, watch.round_trip_ms / 1_000)
        self.loop_alive.add_metric(node, 1 if scheduler.loop_alive() else 0)
        if scheduler.board.last_wake_ms is not None:
            self.last_wake.add_metric(node, scheduler.board.last_wake_ms / 1_000)
        for kind, count in dict(scheduler.board.skipped.counts).items():
            self.skipped_notes.add_metric([*node, kind], count)
        live = scheduler.live
        if live.enabled:
            self.live_revision.add_metric(node, live.revision)
            if live.applied_lag_ms is not None:
                self.live_applied.add_metric(node, live.applied_lag_ms / 1_000)


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    """Cumulative counts per bound, from one copy of the counts (the loop goes on
    counting), so that ``+Inf`` and the count agree."""
    return list(zip(LATENESS_BOUNDS, itertools.accumulate(list(histogram.counts)), strict=True))


def _next_releases(schedule: Schedule, now_ms: int) -> dict[str, int]:
    """The first release after ``now_ms`` of each entry, by name; for a fan-out entry,
    whose tenants are released over the window, its first occurrence after ``now_ms``.

    A release after now may belong to an occurrence up to a jitter window before now, so
    each distinct trigger's occurrences are computed once, from its widest window back,
    and shared by the entries that use it."""
    enabled = [entry for entry in schedule.entries if entry.enabled]
    widest: dict[Trigger, int] = {}
    for entry in enabled:
        widest[entry.windowed] = max(widest.get(entry.windowed, 0), entry.jitter_ms)
    near = {trigger: _near(trigger, now_ms - window, now_ms) for trigger, window in widest.items()}
    releases = {}
    for entry in enabled:
        release = _next_release(schedule, entry, near[entry.windowed], now_ms)
        if release is not None:
            releases[entry.name] = release
    return releases


def _near(trigger: Trigger, from_ms: int, now_ms: int) -> list[int]:
    """The occurrences after ``from_ms``, up to and with the first one after ``now_ms``."""
    found = []
    for occurrence in trigger.after(from_ms):
        found.append(occurrence)
        if occurrence > now_ms:
            break
    return found


def _next_release(schedule: Schedule, entry: Entry, near: list[int], now_ms: int) -> int | None:
    address = schedule.address(entry)
    for occurrence in near:
        if entry.tenants is None:
            key = occurrence_key(entry.trigger, occurrence)
            release = occurrence + offset_ms(address, key, entry.jitter_ms)
        else:
            release = occurrence
        if release > now_ms:
            return release
    return None


class SchedulerCollector:
    """A prometheus_client collector over the schedulers registered in one registry.

    Nothing is kept between scrapes: :meth:`collect` reads each scheduler as it is.
    """

    def __init__(self) -> None:
        self._schedulers: list[NodeView] = []
        self._lock = threading.Lock()

    @property
    def schedulers(self) -> tuple[NodeView, ...]:
        with self._lock:
            return tuple(self._schedulers)

    def add(self, scheduler: NodeView) -> None:
        """Add a scheduler (again: nothing). Another with the same namespace and node
        would export the same series: a :class:`~beatless.errors.ConfigError`."""
        key = (scheduler.schedule.namespace, scheduler.node)
        node = shown(scheduler.node, quoted=False)
        with self._lock:
            if any(s is scheduler for s in self._schedulers):
                return
            if any((s.schedule.namespace, s.node) == key for s in self._schedulers):
                raise ConfigError(
                    f"metrics: a scheduler of node {node} in namespace {shown(key[0])} is "
                    f"already registered in this registry; give each scheduler of one process "
                    f"its own node name"
                )
            self._schedulers.append(scheduler)

    def remove(self, scheduler: NodeView) -> bool:
        """Remove a scheduler; whether it was there."""
        with self._lock:
            kept = [s for s in self._schedulers if s is not scheduler]
            removed = len(kept) != len(self._schedulers)
            self._schedulers = kept
            return removed

    def describe(self) -> Iterator[Metric]:
        """The families, without samples: what a registry checks names against."""
        return iter(_Families.empty())

    def collect(self) -> Iterator[Metric]:
        families = _Families.empty()
        for scheduler in self.schedulers:
            families.add(scheduler)
        return iter(families)


_lock = threading.Lock()
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, SchedulerCollector] = (
    weakref.WeakKeyDictionary()
)
_served: dict[tuple[int, str, int], tuple[WSGIServer, threading.Thread]] = {}
"""The ports :func:`publish` serves, by process id, address and port."""


def _registry(registry: CollectorRegistry | None) -> CollectorRegistry:
    require()
    if registry is not None:
        return registry
    from prometheus_client import REGISTRY

    return REGISTRY


def register(scheduler: NodeView, registry: CollectorRegistry | None = None) -> None:
    """Export ``scheduler``'s metrics from ``registry`` (prometheus_client's default
    registry when ``None``) until :func:`unregister`. One collector per registry holds
    every scheduler registered in it; registering a scheduler twice changes nothing."""
    target = _registry(registry)
    with _lock:
        collector = _collectors.get(target)
        if collector is None:
            collector = SchedulerCollector()
            target.register(collector)
            _collectors[target] = collector
        collector.add(scheduler)


def unregister(scheduler: NodeView) -> None:
    """Stop exporting ``scheduler``'s metrics, from every registry it is registered in;
    a registry left with no scheduler loses the collector too."""
    with _lock:
        for registry, collector in list(_collectors.items()):
            if collector.remove(scheduler) and not collector.schedulers:
                registry.unregister(collector)
                del _collectors[registry]


def serve(
    port: int, *, addr: str = DEFAULT_ADDR, registry: CollectorRegistry | None = None
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` (the default one when ``None``) over HTTP on ``addr:port``, in
    a daemon thread: prometheus_client's ``start_http_server``, whose server and thread
    are returned (``server.shutdown()`` stops it; with port 0, ``server.server_port``
    is the free port taken). A port that cannot be bound is a
    :class:`~beatless.errors.ConfigError` naming it."""
    target = _registry(registry)
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, addr=addr, registry=target)
    except OSError as exc:
        raise ConfigError(
            f"metrics: cannot serve on {addr}:{port} ({exc.strerror or exc}); each process "
            f"needs a port of its own"
        ) from None


def publish(
    scheduler: NodeView,
    *,
    port: int | None = None,
    registry: CollectorRegistry | None = None,
    addr: str = DEFAULT_ADDR,
) -> None:
    """What an integration does where its scheduler starts: :func:`register` it, and
    serve ``registry`` on ``port`` unless this process serves that port already (a
    scheduler built again, a beat beside a worker). A port that cannot be bound is a
    WARNING: the node schedules on without its metrics."""
    register(scheduler, registry)
    if port is None:
        return
    key = (os.getpid(), addr, port)
    with _lock:
        if key in _served:
            return
        try:
            _served[key] = serve(port, addr=addr, registry=registry)
        except ConfigError as exc:
            logger.warning(
                "node %s: %s; it schedules on without them",
                shown(scheduler.node, quoted=False),
                shown(exc, quoted=False, limit=ERROR_LIMIT),
            )
            return
    logger.info("beatless metrics on http://%s:%d/metrics", addr, port)


def metrics_port(value: object, name: str) -> int:
    """A port to serve metrics on, given as a number or its digits, with prometheus-client
    installed: checked where a node is configured, so that a bad one is a start-up
    error naming ``name``."""
    require()
    port = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= MAX_PORT:
        raise ConfigError(f"{name} must be a TCP port (1 to {MAX_PORT}), got {value!r}")
    return port


def metrics_host(value: object, name: str) -> str:
    """An address to serve metrics on (an IP address or a host name of this host), given
    as a non-empty string: checked where a node is configured, so that a bad one is a
    start-up error naming ``name``."""
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ConfigError(
            f"{name} must be an address of this host to listen on, such as '127.0.0.1' "
            f"(the default) or '0.0.0.0' (every interface), got {value!r}"
        )
    return value


def metrics_registry(value: object, name: str) -> CollectorRegistry:
    """A prometheus_client ``CollectorRegistry`` to register a node's scheduler in."""
    require()
    from prometheus_client import CollectorRegistry

    if not isinstance(value, CollectorRegistry):
        raise ConfigError(f"{name} must be a prometheus_client CollectorRegistry, got {value!r}")
    return value
