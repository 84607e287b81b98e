"""Live entries under faults (issue 24): random edits while three node processes run.

Three ``fault_node`` processes on a private Redis run a code entry and read the live
entries of their namespace. This process writes random revisions at random instants
(args changed, trigger changed, deleted, created again, batches of several), each with
the default fence (commit + 2 s) or a later one, for about 30 s. Meanwhile one node is
frozen (SIGSTOP) across several fences, and another's link to the store is paused (a TCP
proxy holding its bytes). Then, from every send the nodes recorded and the revisions in
the store:

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
from collections import Counter
from collections.abc import Callable
from typing import Any

import live_edits as edits
import pytest
from harness import Fleet, next_whole_second, sleep_until
from proxy import Proxy
from redis_server import RedisServer

from beatless.live import Live
from beatless.live.revisions import Revision
from beatless.stores import open_store

pytestmark = [pytest.mark.slow, pytest.mark.faults]

ServerFactory = Callable[[str], RedisServer]
FleetFactory = Callable[[dict[str, Any]], Fleet]
ProxyFactory = Callable[[tuple[str, int]], Proxy]

NAMESPACE = "faults"
NAMES = ("a", "b", "c", "d", "e")
EDITING_S = 30
MAX_LATE_S = edits.MAX_LATE_S
GRACE_S = 4


def edit(live: Live, rng: random.Random, number: int, present: set[str]) -> Revision:
    return edits.edit(live, rng, number, present, names=NAMES, prefix="faults.live")


def test_random_edits_under_a_frozen_node_and_a_paused_link_run_each_occurrence_once_as_in_force(
    redis_server: ServerFactory, proxy: ProxyFactory, fleet: FleetFactory
) -> None:
    """Faults: node n1 frozen for 8 s while edits land (several fences pass), node n2's
    store link paused for 5 s. 0 firings sent twice; every live send is the definition
    of the revision in force at its occurrence (its trigger, task and args); none before
    the fence of the edit that created it or after a delete's."""
    store = redis_server("store")
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
    until = anchor + EDITING_S + 4 + MAX_LATE_S + GRACE_S
    nodes = [{"node": "n0"}, {"node": "n1"}, {"node": "n2", "store": link.url}]
    run.start({"store": store.url, "send_delay_s": 0.005, "until": until}, nodes)
    writer = open_store(store.url, namespace=NAMESPACE)
    live = Live(writer, namespace=NAMESPACE)
    present: set[str] = set()
    written: list[Revision] = [edit(live, rng, 0, present)]
    sleep_until(anchor)
    frozen = paused = None
    while time.time() < anchor + EDITING_S:
        now = time.time() - anchor
        if frozen is None and now >= 6:
            run.freeze("n1")
            frozen = time.time()
        if frozen is not None and frozen > 0 and time.time() - frozen >= 8:
            run.thaw("n1")
            run.fault("n1 frozen", frozen, time.time())
            frozen = -1.0
        if paused is None and now >= 16:
            link.pause()
            paused = time.time()
        if paused is not None and paused > 0 and time.time() - paused >= 5:
            link.resume()
            run.fault("n2 store link paused", paused, time.time())
            paused = -1.0
        written.append(edit(live, rng, len(written), present))
        time.sleep(rng.uniform(0.05, 1.2))
    assert frozen == -1.0
    assert paused == -1.0
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
        f"seed {seed}: {len(revisions)} revisions, {len(sends)} sends "
        f"({dict(live_sends)} live), {len(twice)} sent twice, {len(wrong)} not as in force"
    )
    assert not twice, f"seed {seed}: sent twice: {twice[:5]}"
    assert not wrong, f"seed {seed}: " + "; ".join(wrong[:5])
    assert sum(live_sends.values()) > 50, f"seed {seed}: too few live sends to tell"


def misrun(revisions: list[Revision], send: dict[str, Any]) -> str | None:
    """Why ``send`` is not the definition in force at its occurrence (``None``: it is)."""
    occurrence = int(send["occurrence_ms"])
    return edits.misrun(
        revisions, send["entry"], occurrence, send["task"], send["args"], by=send["node"]
    )
