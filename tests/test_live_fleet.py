"""Three scheduler nodes on Redis and on PostgreSQL while ~200 random live edits land
(args, delete, re-create, batches), fired every second: 0 firings sent twice, every
send's args those of the revision in force at its occurrence, 0 occurrences before a
fence fired by an edit."""

from __future__ import annotations

import random
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from stores import POSTGRES_URL, REDIS

from beatless import Entry, Every, Firing, Schedule
from beatless.errors import StoreError
from beatless.live import Live, entry_in_force
from beatless.node.scheduler import Scheduler
from beatless.stores import open_store

pytestmark = pytest.mark.slow

NAMES = ("a", "b", "c", "d")
EDITS = 200


def entry(name: str, args: tuple[Any, ...]) -> Entry:
    return Entry(name=name, task="t.job", trigger=Every(timedelta(seconds=1)), args=args)


def edit(live: Live, rng: random.Random, present: set[str], n: int) -> None:
    name = rng.choice(NAMES)
    roll = rng.random()
    if name in present and roll < 0.2:
        live.delete(name)
        present.discard(name)
    elif roll < 0.35:
        batch = rng.sample(NAMES, 2)
        live.put_many([entry(x, (n, x)) for x in batch])
        present.update(batch)
    else:
        live.put(entry(name, (n,)))
        present.add(name)


@pytest.mark.parametrize("url", [pytest.param("redis", id="redis"), pytest.param("pg", id="pg")])
def test_random_edits_while_firing_send_each_firing_once_under_its_revision(url: str) -> None:
    target = f"redis://{REDIS[1]}:{REDIS[2]}/0" if url == "redis" else POSTGRES_URL
    namespace = f"livefleet{uuid.uuid4().hex[:8]}"
    sent: list[Firing] = []
    lock = threading.Lock()

    def enqueue(firing: Firing) -> None:
        with lock:
            sent.append(firing)

    schedule = Schedule([], namespace=namespace)
    nodes = [
        Scheduler(
            schedule,
            store=open_store(target, namespace=namespace),
            enqueue=enqueue,
            node=f"n{i}",
        )
        for i in range(3)
    ]
    live = Live(open_store(target, namespace=namespace), namespace=namespace)
    for node in nodes:
        node.start()
    rng = random.Random(24)
    present: set[str] = set()
    refused = 0
    try:
        for n in range(EDITS):
            try:
                edit(live, rng, present, n)
            except StoreError:
                refused += 1  # a slow writer gives up and writes nothing
            time.sleep(rng.uniform(0.02, 0.15))
        time.sleep(4)
    finally:
        for node in nodes:
            node.stop(timeout=10)
    revisions = live.revisions()
    assert len(revisions) >= EDITS - refused - 5
    ids = [f.id for f in sent]
    assert len(ids) == len(set(ids)), "a firing was sent twice"
    assert len(sent) > 20
    for firing in sent:
        wanted = entry_in_force(revisions, firing.entry.name, firing.occurrence_ms)
        assert wanted is not None, f"{firing.entry.name}@{firing.occurrence_ms} before a fence"
        assert list(firing.entry.args) == wanted["args"], (firing.entry.name, firing.occurrence_ms)
