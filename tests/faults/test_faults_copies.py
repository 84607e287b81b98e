"""Second copies end to end: what the nodes send twice, and what real workers run twice.

Where a store link is cut for longer than the lease, the store alone cannot rule out a
second send: a node that sent a firing and could not commit it before its lease ran out
leaves it to another node, which sends it again under the same task id (the two-phase
window, docs/reliability.md). Each such firing must be told by the node that sent it
first (``two_phase_window``, or its WARNING naming the firing), and the workers' once-only
check (``beatless.celery._gate``) must refuse the second copy. A worker that cannot reach
the store waits for it (``check_wait``, 30 s) rather than run a copy unchecked: each fault
here is shorter than that, so no copy may run unchecked either.

Three ``copies_node`` processes (``fault_node`` sending real Celery messages) schedule on
the two-phase path against a private PostgreSQL or a private ``nats-server -js``, each
node through a TCP proxy of its own (``proxy``); two real ``celery worker`` processes of
``copies_app`` (threads pool, ``--without-beatless``: they only run and check) consume
from a private Redis broker, each reaching the store through a proxy of its own too. A
fan-out of 60 tenants due at once every 10 s (20 ms per send, lease 4 s, max_late 20 s)
and an entry every second; the fault is injected while a node sends the second fan-out:

* ``one_link``: that node's link paused 8 s (twice the lease): the others take over the
  firings it sent and could not commit;
* ``all_links``: every node's link to the store paused 8 s (the workers reach it);
* ``store_cut_off``: every link to the store paused 8 s, the workers' too: a worker that
  checks the first copy meanwhile waits for the store (``waited``) and checks it once the
  link is back, so of the first copy and the second one, one runs;
* ``restart``: the store stopped (SIGKILL) mid-fan-out, down 2 s, started again with its
  data (PostgreSQL ``synchronous_commit`` on; NATS on the same JetStream directory). A
  check whose request was under way at the kill fails only at the request's timeout (NATS:
  5 s), after the store is back and maybe after the second copy ran on the other worker:
  it is tried again then, and refused.

Counted per firing: copies sent (the nodes' records), copies run (the workers' notes in
the broker), and whether each firing sent twice was reported by a node (counted
``two_phase_window``, or named in its WARNING); misses reported and unreported (from the
nodes' decisions, ``analysis``). Asserted: no firing run twice, none run unchecked, every
firing sent twice reported, no miss unreported. Each scenario takes about 65 s
(``store_cut_off`` 100 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import harness
import postgres_server
import pytest
import redis
from analysis import read_records
from copies_app import NAMESPACE, QUEUE, RUNS
from harness import Fleet, next_whole_second
from nats_server import NatsServer, nats_server_binary
from proxy import Proxy
from redis_server import RedisServer
from test_faults import GRACE_S, NODES, assert_clean, fanout, schedule, wait_for_sender
from test_faults_stores import missing

from beatless.node.runs import RunPolicy, Runs
from beatless.schedule.firing import firing_id
from beatless.stores import open_store

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FleetFactory = Callable[[dict[str, Any]], Fleet]
ProxyFactory = Callable[[tuple[str, int]], Proxy]
ServerFactory = Callable[[str], RedisServer]

HERE = Path(__file__).resolve().parent
LEASE_S = 4
PAUSE_S = 2 * LEASE_S
DOWN_S = 2.0
MAX_LATE_S = 20
DRAIN_S = 45.0
"""How long the workers may take to run what is queued once the nodes stopped: a second
copy that finds the first copy's once-only record pending waits up to a run lease (30 s)
and a heartbeat before it is judged."""
WORKERS = ("w1", "w2")
REPORTED = harness.TOLD_IN_WINDOW
"""A node's WARNING naming a firing of the two-phase window (``beatless.node.dispatch``)."""
WORKER_VERDICT = re.compile(
    r"beatless: firing (\S+) of \S+ (?:\(attempt \d+\) )?(not run: another copy|runs again|"
    r"runs without its once-only check|run without its once-only check|has its once-only "
    r"record|ran without its once-only check and was a second copy|waits for the claim store|"
    r"ran, but its once-only record is not committed|ran, and its once-only record lapsed)"
)
VERDICT_NAMES = {
    "waits for the claim store": "waited",
    "not run: another copy": "duplicate",
    "runs again": "rerun",
    "has its once-only record": "recorded_late",
    "ran without its once-only check and was a second copy": "ran_twice",
    "ran, but its once-only record is not committed": "commit_owed",
    "ran, and its once-only record lapsed": "ran_twice",
}


# -- private stores --------------------------------------------------------------------


@dataclass
class PrivateStore:
    """A store server of the test's own: its address, a URL through a proxy, and a kill
    and start that keep its data."""

    name: str
    address: tuple[str, int]
    url_through: Callable[[Proxy], str]
    kill: Callable[[], None]
    start: Callable[[], None]


def private_postgres(tmp_path: Path) -> Iterator[PrivateStore]:
    reason = postgres_server.unavailable()
    if reason is not None:
        missing(f"{reason}; this case starts a private PostgreSQL")
    server = postgres_server.PostgresServer(tmp_path / "postgres")
    server.settings = {**server.settings, "synchronous_commit": "on"}
    schema = f"beatless_faults_{uuid.uuid4().hex[:10]}"

    def through(link: Proxy) -> str:
        return f"postgresql://postgres@{link.host}:{link.port}/postgres?schema={schema}"

    try:
        server.start()
        yield PrivateStore(
            "postgres", ("127.0.0.1", server.port), through, server.kill, server.start
        )
    finally:
        server.stop()


def private_nats(tmp_path: Path) -> Iterator[PrivateStore]:
    if nats_server_binary() is None:
        missing("nats-server is not installed; this case starts a private server")
    server = NatsServer(tmp_path / "nats")
    bucket = f"faults_{uuid.uuid4().hex[:10]}"

    def through(link: Proxy) -> str:
        return f"nats://{link.host}:{link.port}/?bucket={bucket}"

    try:
        server.start()
        yield PrivateStore("nats", ("127.0.0.1", server.port), through, server.kill, server.start)
    finally:
        server.kill()


@pytest.fixture(params=[private_postgres, private_nats], ids=["postgres", "nats"])
def private_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PrivateStore]:
    yield from request.param(tmp_path)


# -- real workers --------------------------------------------------------------------------


@dataclass
class Workers:
    """``celery worker`` processes of ``copies_app``, each in a session of its own,
    stopped by process group."""

    workdir: Path
    broker: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, store_url: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(harness.CODE_ROOT), str(HERE)]),
            "PYTHONUNBUFFERED": "1",
            "COPIES_BROKER": self.broker,
            "COPIES_STORE": store_url,
        }
        command = [sys.executable, "-m", "celery", "-A", "copies_app", "worker"]
        command += ["--without-beatless", "-P", "threads", "-c", "4", "-Q", QUEUE]
        command += ["-n", f"{name}@%h", "-l", "INFO", "--without-mingle", "--without-gossip"]
        with self.log(name).open("ab") as out:
            self.processes[name] = subprocess.Popen(
                command,
                env=env,
                cwd=HERE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.worker.log"

    def text(self) -> str:
        return "\n".join(self.log(n).read_text(errors="replace") for n in self.processes)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(" ready." in self.log(n).read_text(errors="replace") for n in self.processes):
                return
            time.sleep(0.2)
        pytest.fail(f"the workers did not start within {timeout}s:\n{self.text()[-4_000:]}")

    def stop(self) -> None:
        """SIGTERM each process group (a warm shutdown), SIGKILL what is left after 10 s."""
        alive = [p for p in self.processes.values() if p.poll() is None]
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in alive:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def workers(tmp_path: Path, redis_server: ServerFactory) -> Iterator[Workers]:
    made = Workers(tmp_path, redis_server("broker").url)
    try:
        yield made
    finally:
        made.stop()


# -- counting ------------------------------------------------------------------------------


@dataclass
class Copies:
    """Copies sent and run per firing, and what the nodes reported."""

    sent: Counter[str]
    ran: Counter[str]
    reported: set[str]
    """Firings a node named in a WARNING of the two-phase window."""
    window_counted: int
    """The nodes' ``two_phase_window`` counters, summed."""
    verdicts: Counter[str]
    """The workers' once-only verdicts logged per firing (``duplicate``, ``rerun``, ...)."""

    @property
    def sent_twice(self) -> list[str]:
        return sorted(f for f, n in self.sent.items() if n > 1)

    @property
    def ran_twice(self) -> list[str]:
        return sorted(f for f, n in self.ran.items() if n > 1)

    @property
    def unreported(self) -> list[str]:
        return [f for f in self.sent_twice if f not in self.reported]

    def line(self) -> str:
        return (
            f"firings sent {len(self.sent)} ({sum(self.sent.values())} copies), sent twice "
            f"{len(self.sent_twice)}, run {len(self.ran)} ({sum(self.ran.values())} copies), "
            f"run twice {len(self.ran_twice)}, sent twice and reported "
            f"{len(self.sent_twice) - len(self.unreported)} (two_phase_window counted "
            f"{self.window_counted}), unreported {len(self.unreported)}; worker verdicts "
            f"{dict(self.verdicts)}; sent and never run {len(set(self.sent) - set(self.ran))}"
        )


def drain(broker: str, before: float) -> None:
    """Wait until the broker's queue is empty and no run was noted for 3 s (at most
    :data:`DRAIN_S` after ``before``)."""
    client = redis.Redis.from_url(broker)
    last, seen = time.monotonic(), -1
    while time.monotonic() - before < DRAIN_S:
        runs = client.llen(RUNS)
        if runs != seen:
            last, seen = time.monotonic(), runs
        if client.llen(QUEUE) == 0 and time.monotonic() - last > 3:
            return
        time.sleep(0.2)


def count_copies(run: Fleet, broker: str, worker_text: str) -> Copies:
    sends, _ = read_records(run.record_path(n) for n in run.names)
    client = redis.Redis.from_url(broker)
    ran = Counter(json.loads(line)["id"] for line in client.lrange(RUNS, 0, -1))
    reported: set[str] = set()
    counted = 0
    for name in run.names:
        log = run.workdir / f"{name}.log"
        if log.exists():
            reported.update(REPORTED.findall(log.read_text(errors="replace")))
        summary = run.summary_path(name)
        if summary.exists():
            stats = json.loads(summary.read_text()).get("stats", {})
            counted += sum(s.get("two_phase_window", 0) for s in stats.values())
    verdicts = Counter(
        VERDICT_NAMES.get(v, "unchecked") for _, v in WORKER_VERDICT.findall(worker_text)
    )
    return Copies(Counter(s.id for s in sends), ran, reported, counted, verdicts)


# -- the scenario ------------------------------------------------------------------------


def copies_scenario(
    store: PrivateStore,
    fault: str,
    *,
    proxy: ProxyFactory,
    fleet: FleetFactory,
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
) -> Copies:
    monkeypatch.setattr(harness, "NODE_SCRIPT", HERE / "copies_node.py")
    node_links = [proxy(store.address) for _ in NODES]
    worker_links = [proxy(store.address) for _ in WORKERS]
    for name, link in zip(WORKERS, worker_links, strict=True):
        workers.start(name, store.url_through(link))
    anchor = next_whole_second(12)
    run = fleet(
        schedule(
            anchor,
            {"name": "tick", "every_s": 1, "max_late_s": MAX_LATE_S},
            fanout(10, jitter_s=0, max_late_s=MAX_LATE_S, tenants=60),
        )
    )
    until = anchor + 10 + PAUSE_S + MAX_LATE_S + GRACE_S
    common = {
        "celery_broker": workers.broker,
        "send_delay_s": 0.02,
        "lease_s": LEASE_S,
        "until": until,
    }
    nodes = [
        {**node, "store": store.url_through(link)}
        for node, link in zip(NODES, node_links, strict=True)
    ]
    workers.wait_ready(timeout=anchor - time.time())
    run.start(common, nodes)
    victim = wait_for_sender(run, anchor + 10, count=10, timeout=anchor + 15 - time.time())
    began = time.time()
    if fault == "restart":
        store.kill()
        time.sleep(DOWN_S)
        store.start()
    else:
        paused = {
            "one_link": [node_links[run.names.index(victim)]],
            "all_links": node_links,
            "store_cut_off": [*node_links, *worker_links],
        }[fault]
        for link in paused:
            link.pause()
        time.sleep(PAUSE_S)
        for link in paused:
            link.resume()
    ended = time.time()
    run.fault(f"{fault} ({victim} sending)", began, ended)
    run.wait(timeout=until - time.time() + 30)
    drain(workers.broker, time.monotonic())
    workers.stop()
    report = run.report((anchor, ended + 5))
    copies = count_copies(run, workers.broker, workers.text())
    print(f"{store.name} {fault}: {copies.line()}")
    problems = []
    if copies.ran_twice:
        problems.append(f"firings run twice: {copies.ran_twice}")
    if copies.verdicts["unchecked"]:
        problems.append(f"{copies.verdicts['unchecked']} copies run unchecked")
    if copies.unreported:
        problems.append(f"firings sent twice that no node reported: {copies.unreported}")
    assert not problems, (
        f"{store.name} {fault}: {'; '.join(problems)}\n{copies.line()}\n{report.details()}"
    )
    assert_copies_report(report)
    return copies


def assert_copies_report(report: Any) -> None:
    """The rest of the suite's bar, less duplicates (the two-phase window, counted above):
    no stale or early send, every miss reported."""
    report.duplicates = report.in_flight_duplicates = 0
    assert_clean(report, misses="reported")


@pytest.mark.parametrize(
    "fault",
    ["one_link", "all_links", "restart", "store_cut_off"],
)
def test_second_copies_are_reported_and_never_run_twice(
    fault: str,
    private_store: PrivateStore,
    *,
    proxy: ProxyFactory,
    fleet: FleetFactory,
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """See the module docstring: one fault on one private store, copies sent and run
    counted per firing; none run twice, each sent twice reported."""
    copies_scenario(
        private_store, fault, proxy=proxy, fleet=fleet, workers=workers, monkeypatch=monkeypatch
    )


# -- one firing across a restart -------------------------------------------------------------

CHECK_WAIT = timedelta(seconds=20)
"""The workers' ``check_wait`` below: longer than the restart and the cut link together."""
ONE_FIRING = RunPolicy("allow", 30_000, 5_000, True, 80_000)
PROCEEDS = ("run", "rerun", "unchecked")


def test_a_copy_whose_check_meets_a_store_restart_waits_and_one_copy_runs(
    private_store: PrivateStore, proxy: ProxyFactory
) -> None:
    """The path that ran a firing twice (NATS ``restart``, under load): a worker's check of
    the first copy was under way when the store was killed, and failed only at its
    request's timeout (5 s), after the store was back; the second copy, sent meanwhile by
    the node that took the firing over, was checked on the other worker and ran. Given up
    then, the first copy ran too (``unchecked``, later ``ran_twice``).

    Here the first worker's link holds its bytes from just before the kill until after the
    second copy ran (its request under way is never answered; a store timeout of 1 s), and
    the second worker reaches the store directly: the first copy must wait for the store
    and be refused, whatever the store."""
    held, direct = proxy(private_store.address), proxy(private_store.address)

    def worker(name: str, link: Proxy) -> Runs:
        url = private_store.url_through(link) + "&timeout=1"
        return Runs(lambda: open_store(url, namespace=NAMESPACE), name, check_wait=CHECK_WAIT)

    first_worker, second_worker = worker("w1", held), worker("w2", direct)
    address = f"{NAMESPACE}/restart/{uuid.uuid4().hex[:8]}"
    id_ = firing_id(address, 1_800_000_000_000)
    try:
        for k, runs in enumerate((first_worker, second_worker)):  # both met the store before
            runs.end(runs.start(firing_id(address, 1_700_000_000_000 + k), address, ONE_FIRING))
        held.pause()
        with ThreadPoolExecutor(1) as pool:
            checking = pool.submit(first_worker.start, id_, address, ONE_FIRING)
            time.sleep(0.2)  # its claim is under way, held by the link
            private_store.kill()
            time.sleep(DOWN_S)
            private_store.start()
            second = second_worker.start(id_, address, ONE_FIRING)
            second_worker.end(second)
            time.sleep(2.0)  # the first check's request times out meanwhile
            held.resume()
            first = checking.result(timeout=CHECK_WAIT.total_seconds() + 10)
        first_worker.end(first)
    finally:
        first_worker.close()
        second_worker.close()

    verdicts = [first.verdict, second.verdict]
    print(f"{private_store.name}: verdicts {verdicts}; {first_worker.counts}")
    assert [v for v in verdicts if v in PROCEEDS] == ["run"], verdicts
    assert verdicts == ["duplicate", "run"]
    assert first_worker.counts.get("waited") == 1
