"""Every operator command against real fleets, by the store's URL and namespace and by the
app: ``status``, ``next``, ``explain``, ``pause``, ``resume`` and ``run-now``.

Two Celery workers of ``integrations/celery_redis`` and two Dramatiq nodes of
``integrations/dramatiq_redis``, each on a Redis broker (the claim store is the broker's
Redis) and on a RabbitMQ broker (the claim store follows it: the RabbitMQ store), always
under a namespace of their own, never ``default``. Each command is run twice, as
``--store URL --namespace NS`` and as ``--celery APP`` / ``--dramatiq BROKER``, and what
it says or changes is checked against what the fleet's tasks record: the live nodes, the
firings it lists (ids recomputed here from the formula of DESIGN.md), a firing that ran,
a paused entry that stops running and runs again once resumed, one manual run per
run-now. A Celery fleet also serves its page through ``celery beatless status --serve``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from service_check import require_service
from stores import free_port

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "celery"), str(HERE / "dramatiq")]

import celery_nodes  # noqa: E402 - found through the paths above
import dramatiq_nodes  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = HERE.parent
PAUSE_WATCH_MS = 3_000
"""How long a paused entry is watched for occurrences that run anyway."""
HONOURED_MS = 1_500
"""A control is honoured by every node within a second (plus a margin)."""


@dataclass(frozen=True)
class Run:
    """One task run, as the example app recorded it."""

    entry: str
    occurrence_ms: int
    id: str


@dataclass
class Fleet:
    """A running fleet and how a command names it."""

    framework: str
    namespace: str
    env: dict[str, str]
    store_url: str
    app: list[str]
    paused: tuple[str, str]
    """Two frequent entries: one paused by the store's URL, one by the app."""
    alive: str
    """A frequent entry never paused, to show the fleet kept running."""
    manual: str
    """The entry run now, by each form once."""
    node_count: int
    started: list[Any] = field(default_factory=list)

    def by_store(self) -> list[str]:
        return ["--store", self.store_url, "--namespace", self.namespace]

    def forms(self) -> dict[str, list[str]]:
        return {"store": self.by_store(), "app": self.app}

    def runs(self) -> list[Run]:
        if self.framework == "celery":
            rows = celery_nodes.read_list(f"{self.namespace}:runs")
            return [Run(r["address"].split("/")[1], r["occurrence_ms"], r["id"]) for r in rows]
        rows = dramatiq_nodes.read_runs(self.namespace)
        return [Run(r["entry"], r["occurrence_ms"], r["message_id"]) for r in rows]

    def address(self, entry: str) -> str:
        return f"{self.namespace}/{entry}"

    def logs(self) -> str:
        if self.framework == "celery":
            return "\n".join(f"--- {n.name}\n{n.text()[-3_000:]}" for n in self.started)
        return "\n".join(n.log.read_text(errors="replace")[-3_000:] for n in self.started)


def firing_id(address: str, occurrence_ms: int) -> str:
    """The id of DESIGN.md, computed here without beatless."""
    h = hashlib.sha256(f"{address}@{occurrence_ms}".encode()).digest()[:16].hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def beatless(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beatless", *args],
        cwd=ROOT,
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def now_ms() -> int:
    return int(time.time() * 1_000)


# -- the fleets -------------------------------------------------------------------------


def celery_fleet(broker: str, tmp_path: Path) -> Iterator[Fleet]:
    namespace = f"bl-fleet-{uuid.uuid4().hex[:10]}"
    url = celery_nodes.REDIS_URL if broker == "redis" else celery_nodes.AMQP_URL
    fleet = Fleet(
        framework="celery",
        namespace=namespace,
        env=celery_nodes.environment(namespace, url),
        # The store follows the broker; the RabbitMQ store spells the vhost "/" as pika does.
        store_url=celery_nodes.REDIS_URL if broker == "redis" else celery_nodes.PIKA_URL,
        app=["--celery", celery_nodes.APP],
        paused=("tick-1s", "tick-1s-args"),
        alive="work-2s",
        manual="minutely",
        node_count=2,
    )
    try:
        for name in ("one", "two"):
            args = celery_nodes.worker_args(name)
            fleet.started.append(celery_nodes.start(name, args, fleet.env, tmp_path))
        ready = celery_nodes.wait_until(lambda: all(n.is_ready() for n in fleet.started), 60)
        assert ready, "a worker's scheduler did not start:\n" + fleet.logs()
        yield fleet
    finally:
        celery_nodes.stop_all(fleet.started)
        celery_nodes.delete_keys(namespace)
        if broker == "rabbitmq":
            celery_nodes.delete_rabbitmq(namespace)


def dramatiq_fleet(broker: str, tmp_path: Path) -> Iterator[Fleet]:
    namespace = f"bl-fleet-{uuid.uuid4().hex[:10]}"
    redis_url, amqp_url = dramatiq_nodes.REDIS_URL, dramatiq_nodes.AMQP_URL
    broker_url, store = (redis_url, redis_url) if broker == "redis" else (amqp_url, "")
    fleet = Fleet(
        framework="dramatiq",
        namespace=namespace,
        env=dramatiq_nodes.environment(namespace, broker_url, store),
        store_url=broker_url,
        app=["--dramatiq", "integrations.dramatiq_redis.app"],
        paused=("tick", "every_two"),
        alive="every_three",
        manual="every_minute",
        node_count=2,
    )
    try:
        for i in range(fleet.node_count):
            log = tmp_path / f"node{i}.log"
            fleet.started.append(dramatiq_nodes.start_node(fleet.env, log))
        dramatiq_nodes.wait_for_schedulers(fleet.started, timeout=60)
        yield fleet
    finally:
        dramatiq_nodes.stop_nodes(fleet.started)
        dramatiq_nodes.delete_keys(namespace)
        if broker == "rabbitmq":
            delete_dramatiq_rabbitmq(namespace)


def delete_dramatiq_rabbitmq(namespace: str) -> None:
    """The queues the example app names after the namespace, and the claim store's names."""
    import pika

    queue = "beatless_" + "".join(c if c.isalnum() else "_" for c in namespace)
    connection = pika.BlockingConnection(pika.URLParameters(dramatiq_nodes.AMQP_URL))
    try:
        channel = connection.channel()
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            channel.queue_delete(queue=name)
    finally:
        connection.close()
    dramatiq_nodes.delete_store_names(namespace)


FLEETS = {"celery": celery_fleet, "dramatiq": dramatiq_fleet}


@pytest.fixture(
    params=[
        pytest.param((framework, broker), id=f"{framework}-{broker}")
        for framework in FLEETS
        for broker in ("redis", "rabbitmq")
    ]
)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    framework, broker = request.param
    require_service("Redis", "127.0.0.1", 6379)
    if broker == "rabbitmq":
        require_service("RabbitMQ", "127.0.0.1", 5672)
    yield from FLEETS[framework](broker, tmp_path)


# -- the test ---------------------------------------------------------------------------


def test_every_command_reads_and_steers_a_real_fleet_by_its_store_and_by_its_app(
    fleet: Fleet,
) -> None:
    assert_status_lists_the_live_nodes(fleet)
    assert_next_lists_the_fleets_firings(fleet)
    assert_explain_finds_a_firing_that_ran(fleet)
    assert_pause_stops_and_resume_restarts_an_entry(fleet)
    assert_run_now_makes_one_run_each(fleet)
    if fleet.framework == "celery":
        assert_celery_beatless_status_serves_the_page(fleet)
    assert "Traceback" not in fleet.logs(), fleet.logs()


def assert_status_lists_the_live_nodes(fleet: Fleet) -> None:
    for form, args in fleet.forms().items():
        seen: dict[str, Any] = {}

        def full(args: list[str] = args, seen: dict[str, Any] = seen) -> bool:
            done = beatless(fleet, "status", *args, "--json")
            seen.update(json.loads(done.stdout) if done.stdout else {"error": done.stderr})
            return len(seen.get("nodes", [])) == fleet.node_count

        assert wait_until(full, 45, interval=1.0), (form, seen, fleet.logs())
        assert {n["framework"] for n in seen["nodes"]} == {fleet.framework}, (form, seen)
        assert {e["entry"] for e in seen["entries"]} >= {*fleet.paused, fleet.manual}, form
        if fleet.framework == "celery":
            names = sorted(n["node"].split("@")[0] for n in seen["nodes"])
            assert names == ["one", "two"], (form, seen["nodes"])


def assert_next_lists_the_fleets_firings(fleet: Fleet) -> None:
    entry = fleet.paused[0]
    for form, args in fleet.forms().items():
        before = now_ms()
        done = beatless(fleet, "next", *args, "--entry", entry, "--count", "3", "--json")
        assert done.returncode == 0, (form, done.stderr)
        firings = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(firings) == 3, (form, done.stdout)
        for firing in firings:
            occurrence = int(datetime.fromisoformat(firing["occurrence"]).timestamp() * 1_000)
            assert firing["address"] == fleet.address(entry), form
            assert firing["id"] == firing_id(fleet.address(entry), occurrence), form
            assert occurrence > before - 1_000, form


def assert_explain_finds_a_firing_that_ran(fleet: Fleet) -> None:
    entry = fleet.paused[0]
    ran: list[Run] = []

    def settled() -> bool:  # sent, and its history posted (every second) since
        ran[:] = [
            r
            for r in fleet.runs()
            if r.entry == entry
            and r.occurrence_ms < now_ms() - 3_000
            and r.id == firing_id(fleet.address(entry), r.occurrence_ms)
        ]
        return bool(ran)

    assert wait_until(settled, 20), fleet.logs()
    at = datetime.fromtimestamp(ran[-1].occurrence_ms / 1_000, UTC).isoformat()
    for form, args in fleet.forms().items():
        done = beatless(fleet, "explain", entry, *args, "--at", at)
        assert done.returncode == 0, (form, done.stderr)
        assert ran[-1].id in done.stdout, (form, done.stdout)
        (happened,) = [line for line in done.stdout.splitlines() if "happened" in line]
        assert "fired:" in happened, (form, done.stdout)


def assert_pause_stops_and_resume_restarts_an_entry(fleet: Fleet) -> None:
    """One entry paused by the store's URL, the other by the app, watched together;
    then each resumed by the other form."""
    forms = list(fleet.forms().values())
    for entry, args in zip(fleet.paused, forms, strict=True):
        done = beatless(fleet, "pause", entry, *args)
        assert done.returncode == 0, (entry, done.stderr)
        assert f"entry {entry!r} of namespace {fleet.namespace!r} paused" in done.stdout
    low = now_ms() + HONOURED_MS
    high = low + PAUSE_WATCH_MS
    time.sleep((high - now_ms()) / 1_000 + 2)  # and any run sent before the pause lands

    def between(entry: str, low: int, high: int) -> list[Run]:
        return [r for r in fleet.runs() if r.entry == entry and low <= r.occurrence_ms <= high]

    for entry in fleet.paused:
        assert not between(entry, low, high), (entry, between(entry, low, high))
    assert between(fleet.alive, low, high), "the fleet stopped running altogether"

    for entry, args in zip(fleet.paused, reversed(forms), strict=True):
        done = beatless(fleet, "resume", entry, *args)
        assert done.returncode == 0, (entry, done.stderr)
    again = now_ms() + HONOURED_MS
    for entry in fleet.paused:
        assert wait_until(lambda e=entry: bool(between(e, again, again + 60_000)), 20), entry


def assert_run_now_makes_one_run_each(fleet: Fleet) -> None:
    entry = fleet.manual

    def manual() -> list[Run]:
        scheduled = fleet.address(entry)
        return [
            r
            for r in fleet.runs()
            if r.entry == entry and r.id != firing_id(scheduled, r.occurrence_ms)
        ]

    assert not manual()
    for form, args in fleet.forms().items():
        done = beatless(fleet, "run-now", entry, *args)
        assert done.returncode == 0, (form, done.stderr)
        assert "queued for one manual firing" in done.stdout, form
    assert wait_until(lambda: len(manual()) >= 2, 20), (manual(), fleet.logs())
    time.sleep(2)  # a request read again must not run again
    runs = manual()
    assert len(runs) == 2, runs
    assert len({r.id for r in runs}) == 2, runs


def _status_for_host(port: int, host: str) -> int:
    """The HTTP status of ``/status.json`` asked for under the Host name ``host``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/status.json", headers={"Host": host})
        return connection.getresponse().status
    finally:
        connection.close()


def assert_celery_beatless_status_serves_the_page(fleet: Fleet) -> None:
    """``celery -A APP beatless status --serve PORT``: the page of ``beatless status``,
    answering only to the host names it serves (``--allow-host`` adds one)."""
    port = free_port()
    command = [sys.executable, "-m", "celery", "-A", celery_nodes.APP, "beatless", "status"]
    process = subprocess.Popen(
        [*command, "--serve", str(port), "--allow-host", "fleet.example"],
        cwd=ROOT,
        env=fleet.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[str, Any] = {}

    def served() -> bool:
        with contextlib.suppress(OSError):
            url = f"http://127.0.0.1:{port}/status.json"
            with urllib.request.urlopen(url, timeout=5) as response:
                seen.update(json.loads(response.read()))
        return len(seen.get("nodes", [])) == fleet.node_count

    try:
        # Under load the page's process can take a while to import the app and read.
        assert wait_until(served, 60), (
            [n.get("node") for n in seen.get("nodes", [])],
            fleet.node_count,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            assert fleet.namespace in response.read().decode()
        assert _status_for_host(port, "fleet.example") == 200
        assert _status_for_host(port, "rebound.example") == 421
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
    assert process.returncode == 0, err
    assert f"serving http://127.0.0.1:{port}/" in err
