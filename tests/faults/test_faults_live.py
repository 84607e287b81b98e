"""Live entries under faults (issue 24): random edits while three node processes run.

Three ``fault_node`` processes on a private server run a code entry and read the live
entries of their namespace. This process writes random revisions at random instants
(args changed, trigger changed, deleted, created again, batches of several), each with
the default fence (commit + 2 s) or a later one, for about 30 s (20 s on the stores
after Redis, to keep the suite's time). Node n1's clock runs 1.5 s fast and n2's 1.5 s
slow, well inside the store's 10 s tolerance: n1 wins the races for claims, and must not
claim an occurrence past a fence it has not read yet. The faults fall on it: it is
frozen (SIGSTOP) across several fences, later its link to the store is paused (a TCP
proxy holding its bytes), and the others take over. Then the store server is killed
(SIGKILL) and started again on its port after 2 s (1.5 s) with what it held: live
entries are the schedule, kept where it lives (Redis with its append-only file,
PostgreSQL recovering its WAL, NATS its JetStream files). An edit refused while the
store is down (or in the seconds after it is back) is not counted as written; the
store's own revisions are what the sends are checked against. It runs on each store
that keeps live entries: Redis, PostgreSQL (which check the revision in the claim) and
NATS (where the nodes' propagation rule alone holds rule 6); RabbitMQ refuses live
entries. Then, from every send the nodes recorded and the revisions in the store:

* no firing is sent twice, but one whose first copy was in flight when a fault struck
  the node sending it (the two-phase window: :func:`analysis.in_flight_at_fault`), which
  that node told if it lived to commit it;
* every live send ran under the revision in force at its occurrence (rule 1): its
  occurrence is one of that definition's trigger, its task and args are that
  definition's (rule 6);
* none is an occurrence before the fence of the edit that made it (rule 2), nor after a
  delete's (rule 5): the revision in force then has no such entry, which the check above
  counts;
* every firing expected (the code entry's, and each occurrence of the live definition
  in force at it) is sent, unless a fault held from its release until it was late (the
  frozen node held its claim: :meth:`analysis.Fault.excuses`) and a node reported it;
  the store's outage is far shorter than max_late (8 s), so it excuses none: the nodes
  retry their claims and reads until it answers. No send is stale or early.

Run with ``python -m pytest tests/faults/test_faults_live.py -m faults -s``; a failure names
its seed, and ``BEATLESS_SEED=n`` runs its edits again (the faults fall by the clock, so a
run is not repeated exactly).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import live_edits as edits
import postgres_server
import pytest
from analysis import Report
from harness import Fleet, drawn_seed, next_whole_second, sleep_until
from live_edits import misrun_send
from nats_server import NatsServer, nats_server_binary
from proxy import Proxy
from redis_server import RedisServer
from test_faults import assert_clean
from test_faults_stores import missing

from beatless.errors import StoreError
from beatless.live import Live
from beatless.live.revisions import Revision
from beatless.stores import open_store

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FleetFactory = Callable[[dict[str, Any]], Fleet]
ProxyFactory = Callable[[tuple[str, int]], Proxy]

NAMESPACE = "faults"
NAMES = ("a", "b", "c", "d", "e")
MAX_LATE_S = edits.MAX_LATE_S
GRACE_S = 4
SKEW_S = 1.5
"""Node n1's clock runs this far ahead, n2's this far behind (the store allows 10 s)."""
SETTLE_S = 3.0
"""An edit begun while the store is down, or this soon after it answers again (a client
still reconnecting), may fail: it is not counted. (One begun while a NATS server is down
fails only when its request times out, 5 s later, whenever the server is back.)"""


@dataclass(frozen=True)
class Timing:
    """When the faults fall, in seconds from the anchor: how long edits go on, when node
    n1 is frozen and for how long, when its link is paused and for how long, when the
    store is killed and how long it stays down."""

    editing_s: float
    freeze_at_s: float
    frozen_s: float
    pause_at_s: float
    paused_s: float
    restart_at_s: float
    down_s: float


LONG = Timing(
    editing_s=30, freeze_at_s=6, frozen_s=8, pause_at_s=16, paused_s=5, restart_at_s=23, down_s=2
)
SHORT = Timing(
    editing_s=20, freeze_at_s=4, frozen_s=6, pause_at_s=11, paused_s=4, restart_at_s=16, down_s=1.5
)
"""The scenario on Redis, and on each store after it: a frozen node still misses several
fences (one every 0.6 s on average), a paused link still outlives the propagation time,
and edits still land while the store is down and after it is back."""


@dataclass(frozen=True)
class LiveStore:
    """A private server of one store: its URL, the same through a proxy, the timing, and
    ``restart(down_s)``: kill it, wait ``down_s``, start it again with what it held."""

    url: str
    address: tuple[str, int]
    timing: Timing
    restart: Callable[[float], None]

    def through(self, link: Proxy) -> str:
        host, port = self.address
        return self.url.replace(f"{host}:{port}", f"{link.host}:{link.port}", 1)


def bounce(kill: Callable[[], None], start: Callable[[], Any]) -> Callable[[float], None]:
    """A restart that leaves the server down ``down_s`` between its kill and its start."""

    def restart(down_s: float) -> None:
        kill()
        time.sleep(down_s)
        start()

    return restart


@pytest.fixture(params=["redis", "postgres", "nats"])
def live_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveStore]:
    """A private server of the store named by the parameter, whose restart keeps what it
    held; stopped by pid at the end."""
    token = uuid.uuid4().hex[:10]
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")("store", appendonly=True)
        yield LiveStore(redis.url, redis.address, LONG, bounce(redis.kill, redis.start))
        return
    if request.param == "postgres":
        reason = postgres_server.unavailable()
        if reason is not None:
            missing(f"{reason}; this case starts a private PostgreSQL")
        postgres = postgres_server.PostgresServer(tmp_path / "postgres")
        postgres.settings |= postgres_server.DURABLE
        try:
            postgres.start()
            url = postgres.url(f"schema=beatless_faults_{token}")
            yield LiveStore(
                url, ("127.0.0.1", postgres.port), SHORT, bounce(postgres.kill, postgres.start)
            )
        finally:
            postgres.stop()
        return
    if nats_server_binary() is None:
        missing("nats-server is not installed; this case starts a private server")
    nats = NatsServer(tmp_path / "nats")
    try:
        nats.start()
        url = nats.url(f"bucket=faults_{token}")
        yield LiveStore(url, ("127.0.0.1", nats.port), SHORT, bounce(nats.kill, nats.start))
    finally:
        nats.kill()


def edit(live: Live, rng: random.Random, number: int, present: set[str]) -> Revision:
    return edits.edit(live, rng, number, present, names=NAMES, prefix="faults.live")


def test_random_edits_under_faults_and_skewed_clocks_run_each_occurrence_once_as_in_force(
    live_store: LiveStore, proxy: ProxyFactory, fleet: FleetFactory
) -> None:
    """Faults: clocks of n1 and n2 1.5 s fast and slow; node n1 frozen for 8 s (6 s after
    Redis) while edits land (several fences pass), then its store link paused for 5 s
    (4 s), the store killed and started again with its data after 2 s (1.5 s). 0 firings
    sent twice; every live send is the definition of the revision in force at its
    occurrence (its trigger, task and args); none before the fence of the edit that
    created it or after a delete's; every expected firing sent but those a fault excuses."""
    store, timing = live_store, live_store.timing
    link = proxy(store.address)
    seed = drawn_seed()
    rng = random.Random(seed)
    anchor = next_whole_second(6)
    run = fleet(
        {
            "namespace": NAMESPACE,
            "anchor_s": anchor,
            "entries": [{"name": "tick", "every_s": 1, "max_late_s": MAX_LATE_S}],
        }
    )
    until = anchor + timing.editing_s + 4 + MAX_LATE_S + GRACE_S
    nodes = [
        {"node": "n0"},
        {"node": "n1", "store": store.through(link), "clock_offset_s": SKEW_S},
        {"node": "n2", "clock_offset_s": -SKEW_S},
    ]
    run.start({"store": store.url, "send_delay_s": 0.005, "until": until}, nodes)
    writer = open_store(store.url, namespace=NAMESPACE)
    live = Live(writer, namespace=NAMESPACE)
    present: set[str] = set()
    written: list[Revision] = [edit(live, rng, 0, present)]
    more, refused = edit_under_faults(
        run, link, store, live=live, rng=rng, anchor=anchor, present=present
    )
    written += more
    run.wait(timeout=until - time.time() + 30)

    revisions = live.revisions()
    writer.close()
    assert [r.number for r in revisions] == list(range(1, len(revisions) + 1))
    assert {r.number for r in written} <= {r.number for r in revisions}
    judged = judge(run, revisions, (anchor, anchor + timing.editing_s + 4))
    report = judged.report
    print(
        f"{store.url.split(':', 1)[0]} seed {seed}: {len(revisions)} revisions "
        f"({refused} edits refused while the store restarted), {judged.sends} sends "
        f"({dict(judged.live_sends)} live), {len(judged.twice)} sent twice, "
        f"{len(judged.wrong)} not as in force, {report.misses} of {report.expected} expected "
        f"missed ({report.excused_misses} excused by a fault, {report.unreported_misses} "
        f"unreported)"
    )
    enough = 50 * timing.editing_s // LONG.editing_s
    judged.assert_as_in_force(seed, enough=enough)


@dataclass(frozen=True)
class Judged:
    """What the nodes of a run with live entries sent, against the revisions in force."""

    report: Report
    sends: int
    live_sends: Counter[str]
    """Sends of live entries, by entry (the code entry ``tick`` left out)."""
    twice: list[str]
    """Firings sent more than once."""
    in_flight: dict[str, str]
    """Of those, the ones whose first copy was in flight at a fault of its node, and which
    (the report's :attr:`~analysis.Report.in_flight`): the two-phase window."""
    wrong: list[str]
    """Live sends that are not the definition in force at their occurrence, and why."""

    def assert_as_in_force(self, seed: int, *, enough: int, killed: Sequence[str] = ()) -> None:
        """0 sent twice but in flight at a fault, 0 not as in force, :func:`assert_clean`
        with misses excused by a fault (the ``killed`` nodes wrote no summary), more than
        ``enough`` live sends."""
        twice = [key for key in self.twice if key not in self.in_flight]
        assert not twice, (
            f"seed {seed}: sent twice, not in flight at a fault of the node that sent it "
            f"first: {twice[:5]} (in flight at a fault: {self.in_flight})"
        )
        assert not self.wrong, f"seed {seed}: " + "; ".join(self.wrong[:5])
        assert_clean(self.report, misses="excused", killed=killed)
        live = sum(self.live_sends.values())
        assert live > enough, f"seed {seed}: {live} live sends, too few to tell"


def judge(run: Fleet, revisions: list[Revision], window_s: tuple[float, float]) -> Judged:
    """Count what the nodes of ``run`` sent against ``revisions``: each firing of the code
    entry and each occurrence of the live definition in force in ``window_s`` expected."""
    sends = [s for name in run.names for s in run.sends_of(name) if "sent" in s]
    window_ms = (int(window_s[0] * 1_000), int(window_s[1] * 1_000))
    report = run.report(
        window_s,
        also_expected=edits.firings_in_force(revisions, NAMESPACE, *window_ms),
        told=True,
    )
    return Judged(
        report=report,
        sends=len(sends),
        live_sends=Counter(s["entry"] for s in sends if s["entry"] != "tick"),
        twice=[i for i, n in Counter(s["id"] for s in sends).items() if n > 1],
        in_flight=report.in_flight,
        wrong=[w for s in sends if s["entry"] != "tick" and (w := misrun_send(revisions, s))],
    )


def edit_under_faults(
    run: Fleet,
    link: Proxy,
    store: LiveStore,
    *,
    live: Live,
    rng: random.Random,
    anchor: float,
    present: set[str],
) -> tuple[list[Revision], int]:
    """From ``anchor`` on, random edits at random instants while node n1 is frozen, its
    link paused and the store restarted, as the store's timing says; the revisions
    written, and how many edits the store refused while it restarted (a
    :class:`~beatless.errors.StoreError` then is an edit not written; at any other time
    it fails the test)."""
    timing = store.timing
    sleep_until(anchor)
    written: list[Revision] = []
    refused = 0
    frozen = paused = None
    outage: list[float] = []

    def restart() -> None:
        outage.append(time.time())
        store.restart(timing.down_s)
        outage.append(time.time())

    restarter = threading.Thread(target=restart, name="store-restart", daemon=True)
    try:
        while time.time() < anchor + timing.editing_s:
            now = time.time() - anchor
            if frozen is None and now >= timing.freeze_at_s:
                run.freeze("n1")
                frozen = time.time()
            if frozen is not None and frozen > 0 and time.time() - frozen >= timing.frozen_s:
                run.thaw("n1")
                run.fault("n1 frozen", frozen, time.time(), nodes=["n1"])
                frozen = -1.0
            if paused is None and now >= timing.pause_at_s:
                link.pause()
                paused = time.time()
            if paused is not None and paused > 0 and time.time() - paused >= timing.paused_s:
                link.resume()
                run.fault("n1 store link paused", paused, time.time(), nodes=["n1"])
                paused = -1.0
            if not restarter.is_alive() and not outage and now >= timing.restart_at_s:
                restarter.start()
            began = time.time()
            try:
                written.append(edit(live, rng, len(written) + 1, present))
            except StoreError:
                if not outage or (len(outage) == 2 and began > outage[1] + SETTLE_S):
                    raise
                refused += 1
            time.sleep(rng.uniform(0.05, 1.2))
    finally:
        if restarter.is_alive() or outage:
            restarter.join(timeout=60)
    assert frozen == -1.0
    assert paused == -1.0
    assert len(outage) == 2, "the store was not restarted within the editing time"
    run.fault("store restarted", outage[0], outage[1])
    return written, refused
