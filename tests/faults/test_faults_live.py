"""Live entries under faults (issue 24): random edits while three node processes run.

Three ``fault_node`` processes on a private server run a code entry and read the live
entries of their namespace. This process writes random revisions at random instants
(args changed, trigger changed, deleted, created again, batches of several), each with
the default fence (commit + 2 s) or a later one, for about 30 s (20 s on the stores
after Redis, to keep the suite's time). Meanwhile one node is frozen (SIGSTOP) across
several fences, and another's link to the store is paused (a TCP proxy holding its
bytes). It runs on each store that keeps live entries: Redis, PostgreSQL (which check the
revision in the claim) and NATS (where the nodes' propagation rule alone holds rule 6);
RabbitMQ refuses live entries. Then, from every send the nodes recorded and the revisions
in the store:

* no firing is sent twice;
* every live send ran under the revision in force at its occurrence (rule 1): its
  occurrence is one of that definition's trigger, its task and args are that
  definition's (rule 6);
* none is an occurrence before the fence of the edit that made it (rule 2), nor after a
  delete's (rule 5): the revision in force then has no such entry, which the check above
  counts.

Run with ``python -m pytest tests/faults/test_faults_live.py -m faults -s``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import live_edits as edits
import pytest
from harness import Fleet, next_whole_second, sleep_until
from proxy import Proxy
from redis_server import RedisServer
from test_faults_stores import private_nats, private_postgres

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


@dataclass(frozen=True)
class Timing:
    """When the faults fall, in seconds from the anchor: how long edits go on, when node
    n1 is frozen and for how long, when n2's link is paused and for how long."""

    editing_s: float
    freeze_at_s: float
    frozen_s: float
    pause_at_s: float
    paused_s: float


LONG = Timing(editing_s=30, freeze_at_s=6, frozen_s=8, pause_at_s=16, paused_s=5)
SHORT = Timing(editing_s=20, freeze_at_s=4, frozen_s=6, pause_at_s=12, paused_s=4)
"""The scenario on Redis, and on each store after it: a frozen node still misses several
fences (one every 0.6 s on average), a paused link still outlives the propagation time."""


@dataclass(frozen=True)
class LiveStore:
    """A private server of one store: its URL, the same through a proxy, and the timing."""

    url: str
    address: tuple[str, int]
    timing: Timing

    def through(self, link: Proxy) -> str:
        host, port = self.address
        return self.url.replace(f"{host}:{port}", f"{link.host}:{link.port}", 1)


@pytest.fixture(params=["redis", "postgres", "nats"])
def live_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveStore]:
    """A private server of the store named by the parameter; stopped by pid at the end."""
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")("store")
        yield LiveStore(server.url, server.address, LONG)
        return
    private = private_postgres if request.param == "postgres" else private_nats
    for made in private(tmp_path, uuid.uuid4().hex[:10]):
        where = urlsplit(made.url)
        assert where.hostname is not None
        assert where.port is not None
        yield LiveStore(made.url, (where.hostname, where.port), SHORT)


def edit(live: Live, rng: random.Random, number: int, present: set[str]) -> Revision:
    return edits.edit(live, rng, number, present, names=NAMES, prefix="faults.live")


def test_random_edits_under_a_frozen_node_and_a_paused_link_run_each_occurrence_once_as_in_force(
    live_store: LiveStore, proxy: ProxyFactory, fleet: FleetFactory
) -> None:
    """Faults: node n1 frozen for 8 s (6 s after Redis) while edits land (several fences
    pass), node n2's store link paused for 5 s (4 s). 0 firings sent twice; every live
    send is the definition of the revision in force at its occurrence (its trigger, task
    and args); none before the fence of the edit that created it or after a delete's."""
    store, timing = live_store, live_store.timing
    link = proxy(store.address)
    seed = random.randrange(2**32)
    print(f"seed {seed}")
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
    nodes = [{"node": "n0"}, {"node": "n1"}, {"node": "n2", "store": store.through(link)}]
    run.start({"store": store.url, "send_delay_s": 0.005, "until": until}, nodes)
    writer = open_store(store.url, namespace=NAMESPACE)
    live = Live(writer, namespace=NAMESPACE)
    present: set[str] = set()
    written: list[Revision] = [edit(live, rng, 0, present)]
    written += edit_under_faults(
        run, link, live=live, rng=rng, anchor=anchor, timing=timing, present=present
    )
    run.wait(timeout=until - time.time() + 30)

    revisions = live.revisions()
    writer.close()
    assert [r.number for r in revisions] == list(range(1, len(revisions) + 1))
    assert {r.number for r in written} <= {r.number for r in revisions}
    sends = [s for name in run.names for s in run.sends_of(name) if "sent" in s]
    twice = [i for i, n in Counter(s["id"] for s in sends).items() if n > 1]
    wrong = [why for s in sends if s["entry"] != "tick" and (why := misrun(revisions, s))]
    live_sends = Counter(s["entry"] for s in sends if s["entry"] != "tick")
    print(
        f"{store.url.split(':', 1)[0]} seed {seed}: {len(revisions)} revisions, {len(sends)} sends "
        f"({dict(live_sends)} live), {len(twice)} sent twice, {len(wrong)} not as in force"
    )
    assert not twice, f"seed {seed}: sent twice: {twice[:5]}"
    assert not wrong, f"seed {seed}: " + "; ".join(wrong[:5])
    enough = 50 * timing.editing_s // LONG.editing_s
    assert sum(live_sends.values()) > enough, f"seed {seed}: too few live sends to tell"


def edit_under_faults(
    run: Fleet,
    link: Proxy,
    *,
    live: Live,
    rng: random.Random,
    anchor: float,
    timing: Timing,
    present: set[str],
) -> list[Revision]:
    """From ``anchor`` on, random edits at random instants while node n1 is frozen and
    node n2's link paused, as ``timing`` says; the revisions written."""
    sleep_until(anchor)
    written: list[Revision] = []
    frozen = paused = None
    while time.time() < anchor + timing.editing_s:
        now = time.time() - anchor
        if frozen is None and now >= timing.freeze_at_s:
            run.freeze("n1")
            frozen = time.time()
        if frozen is not None and frozen > 0 and time.time() - frozen >= timing.frozen_s:
            run.thaw("n1")
            run.fault("n1 frozen", frozen, time.time())
            frozen = -1.0
        if paused is None and now >= timing.pause_at_s:
            link.pause()
            paused = time.time()
        if paused is not None and paused > 0 and time.time() - paused >= timing.paused_s:
            link.resume()
            run.fault("n2 store link paused", paused, time.time())
            paused = -1.0
        written.append(edit(live, rng, len(written) + 1, present))
        time.sleep(rng.uniform(0.05, 1.2))
    assert frozen == -1.0
    assert paused == -1.0
    return written


def misrun(revisions: list[Revision], send: dict[str, Any]) -> str | None:
    """Why ``send`` is not the definition in force at its occurrence (``None``: it is)."""
    occurrence = int(send["occurrence_ms"])
    return edits.misrun(
        revisions, send["entry"], occurrence, send["task"], send["args"], by=send["node"]
    )
