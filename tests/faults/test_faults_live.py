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
from datetime import timedelta
from typing import Any

import pytest
from harness import Fleet, next_whole_second, sleep_until
from proxy import Proxy
from redis_server import RedisServer

from beatless import Entry, Every
from beatless.live import Live, entry_in_force
from beatless.live.codec import entry_from_json
from beatless.live.revisions import Revision
from beatless.stores import open_store

pytestmark = [pytest.mark.slow, pytest.mark.faults]

ServerFactory = Callable[[str], RedisServer]
FleetFactory = Callable[[dict[str, Any]], Fleet]
ProxyFactory = Callable[[tuple[str, int]], Proxy]

NAMESPACE = "faults"
NAMES = ("a", "b", "c", "d", "e")
EDITING_S = 30
MAX_LATE_S = 8
GRACE_S = 4


def live_entry(name: str, rng: random.Random, edit: int) -> Entry:
    """A definition of ``name``: every 1, 2 or 3 s (with jitter inside its window at
    times), args naming the edit that wrote it."""
    every_s = rng.choice((1, 2, 3))
    jitter_ms = rng.choice((0, 0, 200, 400 * every_s))
    return Entry(
        name=name,
        task=f"faults.live.{name}",
        trigger=Every(every_s),
        args=(edit, name),
        jitter=timedelta(milliseconds=min(jitter_ms, 499 * every_s)),
        max_late=f"{MAX_LATE_S}s",
    )


def edit(live: Live, rng: random.Random, number: int, present: set[str]) -> Revision:
    """One random revision: put (new or changed), delete, or a batch of puts and deletes."""
    how: dict[str, Any] = {"note": f"edit {number}"}
    if rng.random() < 0.3:
        how["effective_in"] = f"{rng.choice((2.5, 3, 4))}s"
    roll = rng.random()
    if roll < 0.2 and len(present) > 1:
        gone = rng.sample(sorted(present), rng.randint(1, min(2, len(present))))
        revision = live.delete_many(gone, **how)
        present -= set(gone)
        return revision
    if roll < 0.4:
        names = rng.sample(NAMES, rng.randint(2, 4))
        revision = live.put_many([live_entry(n, rng, number) for n in names], **how)
        present |= set(names)
        return revision
    name = rng.choice(NAMES)
    revision = live.put(live_entry(name, rng, number), **how)
    present.add(name)
    return revision


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
    data = entry_in_force(revisions, send["entry"], occurrence)
    said = f"{send['entry']}@{occurrence} by {send['node']} (args {send['args']})"
    if data is None:
        return f"{said}: no such live entry in force then (before its fence, or deleted)"
    entry = entry_from_json(dict(data))
    if next(iter(entry.trigger.after(occurrence - 1))) != occurrence:
        return f"{said}: not an occurrence of {entry.trigger.describe()}, the trigger in force"
    if send["task"] != entry.task or send["args"] != list(entry.args):
        return f"{said}: the revision in force sends {entry.task} with args {list(entry.args)}"
    return None
