"""Prometheus metrics (``beatless.ops.metrics``): real schedulers on one memory store and a
clock the test moves, scraped over HTTP from :func:`beatless.ops.metrics.serve` and read with
prometheus_client's own parser."""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from stores import ManualClock, free_port
from test_status import Fleet as StatusFleet

pytest.importorskip("prometheus_client", reason="the metrics need the 'metrics' extra")

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from scrape import won_samples

from beatless import Entry, Every, Schedule
from beatless.errors import ConfigError
from beatless.node.scheduler import Scheduler
from beatless.ops import metrics
from beatless.schedule.firing import offset_ms
from beatless.stores import MemoryStore

NS = "metrics-test"
NODE_SERIES = (
    "beatless_live_nodes",
    "beatless_schedule_fingerprints",
    "beatless_tzdata_versions",
    "beatless_clock_offset_seconds",
    "beatless_store_round_trip_seconds",
    "beatless_loop_alive",
    "beatless_loop_last_wake_timestamp_seconds",
)


def schedule(fan_jitter: str = "3s") -> Schedule:
    return Schedule(
        [
            Entry(name="tick", task="tests.tick", trigger=Every(1), max_late="5s"),
            Entry(name="slow", task="tests.slow", trigger=Every(10), jitter="4s"),
            Entry(
                name="fan",
                task="tests.fan",
                trigger=Every(10),
                tenants=["a", "b", "c"],
                jitter=fan_jitter,
            ),
        ],
        namespace=NS,
    )


class Fleet(StatusFleet):
    """Two nodes of this module's schedule (see :class:`test_status.Fleet`)."""

    plan = staticmethod(schedule)

    def __init__(self, count: int = 2) -> None:
        super().__init__(count)


@dataclass(frozen=True)
class Scrape:
    """One exposition, as prometheus_client's parser reads it."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    @classmethod
    def of(cls, text: str) -> Scrape:
        return cls(
            {
                (sample.name, frozenset(sample.labels.items())): sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
            }
        )

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def scrape(registry: CollectorRegistry) -> Iterator[Callable[[], Scrape]]:
    """Reads ``registry`` over HTTP, from the server :func:`beatless.ops.metrics.serve` starts."""
    server, thread = metrics.serve(0, addr="127.0.0.1", registry=registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"

    def read() -> Scrape:
        with urllib.request.urlopen(url, timeout=10) as response:
            return Scrape.of(response.read().decode())

    yield read
    server.shutdown()
    server.server_close()
    thread.join(5)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_firing_counts_and_the_lateness_histogram_are_the_schedulers_own(
    registry: CollectorRegistry, scrape: Callable[[], Scrape]
) -> None:
    fleet = Fleet()
    for node in fleet.nodes:
        metrics.register(node, registry)
    fleet.run(25)

    seen = scrape()

    won = 0.0
    for node in fleet.nodes:
        for name, stats in node.stats.items():
            labels = {"namespace": NS, "node": node.node, "entry": name}
            for outcome in metrics.OUTCOMES:
                count = seen.get("beatless_firings_total", **labels, outcome=outcome)
                assert count == getattr(stats, outcome), (node.node, name, outcome)
            assert seen.get("beatless_missed_firings_total", **labels) == stats.missed
            histogram = "beatless_release_lateness_seconds"
            assert seen.get(f"{histogram}_count", **labels) == stats.won
            assert seen.get(f"{histogram}_bucket", **labels, le="+Inf") == stats.won
            assert seen.get(f"{histogram}_sum", **labels) == pytest.approx(
                stats.lateness.sum_ms / 1_000
            )
            cumulative = [
                seen.get(f"{histogram}_bucket", **labels, le=le) for le in metrics.LATENESS_BOUNDS
            ]
            assert cumulative == sorted(cumulative)  # type: ignore[type-var]
            won += stats.won
    tick_won = [
        seen.get("beatless_firings_total", namespace=NS, node=n.node, entry="tick", outcome="won")
        for n in fleet.nodes
    ]
    # Every second of the run was sent once, by one node or the other.
    assert sum(v or 0 for v in tick_won) >= 20
    assert won > 0
    assert {"won", "lost", "late_node", "missed", "takeovers"} <= set(metrics.OUTCOMES)


def test_live_nodes_and_drift_come_from_the_registry_the_node_read(
    registry: CollectorRegistry, scrape: Callable[[], Scrape]
) -> None:
    fleet = Fleet()
    n0, n1 = fleet.nodes
    metrics.register(n0, registry)
    assert scrape().get("beatless_live_nodes", namespace=NS, node="n0") is None  # not read yet

    fleet.run(6)  # n0 read the registry first alone, and again 5 s later with n1
    seen = scrape()
    assert seen.get("beatless_live_nodes", namespace=NS, node="n0") == 2
    assert seen.get("beatless_schedule_fingerprints", namespace=NS, node="n0") == 1
    assert seen.get("beatless_tzdata_versions", namespace=NS, node="n0") == 1

    other = fleet.node("n2", schedule(fan_jitter="2s"))  # another version of the schedule
    fleet.run(6, [n0, n1, other])
    seen = scrape()
    assert seen.get("beatless_live_nodes", namespace=NS, node="n0") == 3
    assert seen.get("beatless_schedule_fingerprints", namespace=NS, node="n0") == 2
    assert seen.get("beatless_tzdata_versions", namespace=NS, node="n0") == 1


def test_clock_offset_and_round_trip_appear_once_measured(
    registry: CollectorRegistry, scrape: Callable[[], Scrape]
) -> None:
    fleet = Fleet(1)
    (node,) = fleet.nodes
    metrics.register(node, registry)
    before = scrape()
    assert before.get("beatless_clock_offset_seconds", namespace=NS, node="n0") is None
    assert before.get("beatless_store_round_trip_seconds", namespace=NS, node="n0") is None

    fleet.run(2)
    seen = scrape()

    assert seen.get("beatless_clock_offset_seconds", namespace=NS, node="n0") == 0
    round_trip = seen.get("beatless_store_round_trip_seconds", namespace=NS, node="n0")
    assert round_trip is not None
    assert 0 <= round_trip < 1


def test_a_stopped_loop_shows_as_not_alive_with_its_last_wake(
    registry: CollectorRegistry, scrape: Callable[[], Scrape]
) -> None:
    fleet = Fleet(1)
    (node,) = fleet.nodes
    metrics.register(node, registry)
    assert (
        scrape().get("beatless_loop_last_wake_timestamp_seconds", namespace=NS, node="n0") is None
    )

    node.start()
    try:
        assert wait_for(lambda: node.board.last_wake_ms is not None)
        seen = scrape()
        assert seen.get("beatless_loop_alive", namespace=NS, node="n0") == 1
    finally:
        node.stop(timeout=5)
    seen = scrape()

    assert seen.get("beatless_loop_alive", namespace=NS, node="n0") == 0
    assert seen.get("beatless_loop_last_wake_timestamp_seconds", namespace=NS, node="n0") == (
        fleet.clock.now_ms() / 1_000
    )


def test_the_next_release_is_the_first_after_now_even_of_an_occurrence_before_it(
    registry: CollectorRegistry, scrape: Callable[[], Scrape]
) -> None:
    plan = schedule()
    slow = plan.entry("slow")
    address = plan.address(slow)
    # An occurrence whose release is still ahead: now is just before it.
    occurrence = next(
        o
        for o in range(1_800_000_000_000, 1_800_001_000_000, 10_000)
        if offset_ms(address, o, slow.jitter_ms) > 1_000
    )
    release = occurrence + offset_ms(address, occurrence, slow.jitter_ms)
    clock = ManualClock((release - 500) / 1_000)
    node = Scheduler(plan, store=MemoryStore(clock=clock), clock=clock, node="n0")
    metrics.register(node, registry)

    seen = scrape()

    def next_release(entry: str) -> float | None:
        return seen.get(
            "beatless_next_release_timestamp_seconds", namespace=NS, node="n0", entry=entry
        )

    assert next_release("slow") == release / 1_000
    # A fan-out entry: its next occurrence; its tenants are released over the window.
    assert next_release("fan") == (occurrence + 10_000) / 1_000
    tick = (clock.now_ms() // 1_000 + 1) * 1_000
    assert next_release("tick") == tick / 1_000


def test_an_unregistered_scheduler_leaves_the_exposition(
    registry: CollectorRegistry, scrape: Callable[[], Scrape]
) -> None:
    fleet = Fleet()
    n0, n1 = fleet.nodes
    metrics.register(n0, registry)
    metrics.register(n1, registry)
    metrics.register(n1, registry)  # again: nothing changes
    fleet.run(1)
    assert {
        dict(labels)["node"] for name, labels in scrape().samples if name == "beatless_loop_alive"
    } == {"n0", "n1"}

    metrics.unregister(n0)
    assert scrape().get("beatless_loop_alive", namespace=NS, node="n0") is None
    assert scrape().get("beatless_loop_alive", namespace=NS, node="n1") == 1
    metrics.unregister(n1)
    assert not {name for name in scrape().names() if name.startswith("beatless_")}
    metrics.unregister(n1)  # not registered: nothing to do


def test_two_schedulers_with_one_node_name_are_refused_in_one_registry(
    registry: CollectorRegistry,
) -> None:
    fleet = Fleet(1)
    twin = fleet.node("n0")
    metrics.register(fleet.nodes[0], registry)

    with pytest.raises(ConfigError, match="node n0 in namespace 'metrics-test' is already"):
        metrics.register(twin, registry)
    metrics.register(twin, CollectorRegistry())  # another registry is another exposition


def test_the_default_registry_is_prometheus_clients_own() -> None:
    (node,) = Fleet(1).nodes
    metrics.register(node)
    try:
        assert (
            REGISTRY.get_sample_value("beatless_loop_alive", {"namespace": NS, "node": "n0"}) == 1
        )
    finally:
        metrics.unregister(node)
    assert REGISTRY.get_sample_value("beatless_loop_alive", {"namespace": NS, "node": "n0"}) is None


def test_a_port_already_taken_is_a_config_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve on 127.0.0.1:{port}"):
            metrics.serve(port, addr="127.0.0.1", registry=CollectorRegistry())


def test_publish_serves_a_port_once_per_process_for_every_scheduler(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = Fleet()
    n0, n1 = fleet.nodes
    port = free_port()
    try:
        metrics.publish(n0, port=port, registry=registry, addr="127.0.0.1")
        metrics.publish(n1, port=port, registry=registry, addr="127.0.0.1")  # served already
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            seen = Scrape.of(response.read().decode())
    finally:
        metrics.unregister(n0)
        metrics.unregister(n1)
        served = metrics._served.pop((os.getpid(), "127.0.0.1", port), None)
        if served is not None:
            served[0].shutdown()
            served[0].server_close()
    assert seen.get("beatless_loop_alive", namespace=NS, node="n0") == 1
    assert seen.get("beatless_loop_alive", namespace=NS, node="n1") == 1
    assert "cannot serve" not in caplog.text


def test_the_exposition_listens_on_this_host_only_unless_told(
    registry: CollectorRegistry,
) -> None:
    server, thread = metrics.serve(0, registry=registry)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    (node,) = Fleet(1).nodes
    port = free_port()
    try:
        metrics.publish(node, port=port, registry=registry)
        assert (os.getpid(), "127.0.0.1", port) in metrics._served
    finally:
        metrics.unregister(node)
        served = metrics._served.pop((os.getpid(), "127.0.0.1", port), None)
        if served is not None:
            served[0].shutdown()
            served[0].server_close()


@pytest.mark.parametrize("value", ["", " 0.0.0.0", None, 8080])
def test_a_metrics_host_must_be_an_address(value: object) -> None:
    with pytest.raises(ConfigError, match="setting_name must be an address of this host"):
        metrics.metrics_host(value, "setting_name")
    assert metrics.metrics_host("10.0.0.5", "setting_name") == "10.0.0.5"


def test_beatless_run_refuses_a_metrics_host_without_a_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from beatless.cli.command import main

    plan = tmp_path / "schedule.toml"
    plan.write_text('[[entry]]\nname = "tick"\ntask = "t"\nevery = "1s"\n')
    store = f"sqlite:///{tmp_path / 'claims.db'}"
    assert main(["run", str(plan), "--store", store, "--metrics-host", "10.0.0.5"]) == 2
    assert "--metrics-host needs --metrics-port" in capsys.readouterr().err


@pytest.mark.parametrize("value", [True, 0, 70_000, "x", 9808.0, None])
def test_a_metrics_port_must_be_a_tcp_port(value: object) -> None:
    with pytest.raises(ConfigError, match="setting_name must be a TCP port"):
        metrics.metrics_port(value, "setting_name")


def test_a_metrics_port_may_be_written_as_digits() -> None:
    assert metrics.metrics_port("9808", "p") == 9808
    assert metrics.metrics_port(9808, "p") == 9808


def test_without_prometheus_client_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    (node,) = Fleet(1).nodes
    for attempt in (
        lambda: metrics.register(node),
        lambda: metrics.serve(0),
        lambda: metrics.metrics_port(9808, "beatless_metrics_port"),
    ):
        with pytest.raises(ConfigError, match=r"pip install 'beatless\[metrics\]'"):
            attempt()


@pytest.mark.slow
def test_beatless_run_serves_its_metrics_on_the_port_given(tmp_path: Path) -> None:
    import subprocess

    plan = tmp_path / "schedule.toml"
    plan.write_text(
        'namespace = "run-metrics"\n\n[[entry]]\nname = "tick"\ntask = "t"\nevery = "1s"\n'
    )
    port = free_port()
    command = [sys.executable, "-m", "beatless", "run", str(plan), "--node", "r0"]
    command += ["--store", f"sqlite:///{tmp_path / 'claims.db'}", "--metrics-port", str(port)]
    node = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        won = None
        while won is None and time.monotonic() < deadline:
            time.sleep(0.5)
            for sample in won_samples(port) or ():
                if sample.labels.get("node") == "r0" and sample.value > 0:
                    won = sample.value
        assert won, "no won firing in the metrics of beatless run"
    finally:
        node.kill()
        node.wait(10)


def test_the_live_revision_its_time_to_apply_and_its_outcomes_are_exported(
    registry: CollectorRegistry, scrape: Callable[[], Scrape]
) -> None:
    from beatless.live import Live

    store = MemoryStore()
    Live(store, namespace=NS).put(Entry(name="live", task="tests.live", trigger=Every(60)))
    node = Scheduler(schedule(), store=store, node="n0")
    node.tick()  # applies the revision its start read
    metrics.register(node, registry)

    seen = scrape()
    assert seen.get("beatless_live_revision", namespace=NS, node="n0") == 1
    applied = seen.get("beatless_live_applied_seconds", namespace=NS, node="n0")
    assert applied is not None
    assert 0 <= applied < 5
    for outcome in ("stale_schedule", "unscheduled"):  # per entry, from its first decision
        assert outcome in metrics.OUTCOMES
        labels = {"namespace": NS, "node": "n0", "entry": "tick", "outcome": outcome}
        assert seen.get("beatless_firings_total", **labels) == 0
