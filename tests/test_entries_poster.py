"""The entries' notes are posted by one node a minute per schedule, in batches
(:mod:`beatless.node._entries`)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beatless.errors import StoreError
from beatless.fleet._notes import ENTRIES_EVERY_MS, NodeRecord
from beatless.node._entries import ENTRIES_BATCH, EntriesPoster, poster
from beatless.stores.base import Note
from beatless.stores.memory import MemoryStore

KIND = "entries:test"


def record(node: str, fingerprint: str = "f1") -> NodeRecord:
    return NodeRecord(node, "h", 1, "1", "x", "memory", fingerprint, "2025a", 0, 1, 1, 0, True, 1)


def entry_notes(count: int) -> list[Note]:
    return [Note(KIND, f"e{i}", f'{{"entry": "e{i}"}}', 300_000) for i in range(count)]


class CountingStore(MemoryStore):
    """The memory store, keeping the size of each post."""

    def __init__(self) -> None:
        super().__init__()
        self.posts: list[int] = []

    def post(self, notes: Sequence[Note]) -> None:
        self.posts.append(len(notes))
        super().post(notes)


names = st.lists(st.text("abcdefgh", min_size=1, max_size=6), min_size=1, max_size=12, unique=True)


@given(names, st.integers(0, 10**9), st.randoms())
def test_every_node_names_the_same_poster_among_those_of_its_schedule(
    nodes: list[str], minute: int, rng: random.Random
) -> None:
    registry = [record(n, "f1" if i % 3 else "f2") for i, n in enumerate(nodes)]
    shuffled = registry[:]
    rng.shuffle(shuffled)
    chosen = poster(registry, "f1", minute)
    assert chosen == poster(shuffled, "f1", minute)
    ones = {r.node for r in registry if r.fingerprint == "f1"}
    assert chosen in ones if ones else chosen is None


def test_the_poster_changes_from_minute_to_minute_over_the_whole_fleet() -> None:
    registry = [record(f"n{i}") for i in range(5)]
    chosen = Counter(poster(registry, "f1", minute) for minute in range(1_000))
    assert set(chosen) == {f"n{i}" for i in range(5)}
    assert min(chosen.values()) > 120  # about 200 each


def test_a_fleet_posts_its_entries_once_a_minute() -> None:
    registry = [record(f"n{i}") for i in range(10)]
    store = CountingStore()
    nodes = [EntriesPoster(r.node, lambda: entry_notes(3)) for r in registry]
    start = 1_000 * ENTRIES_EVERY_MS + 500
    for second in range(60 * 60):  # an hour of syncs, a second apart
        for node in nodes:
            node.sync(store, start + second * 1_000, registry, "f1")
    # One in each of the hour's 60 minutes: at the start, only that minute's poster (each
    # node finds the others on its schedule in the registry).
    assert sum(node.posts for node in nodes) == 60
    assert len(store.posts) == 60
    assert store.read_notes([KIND])[KIND].keys() == {"e0", "e1", "e2"}


def test_a_node_alone_or_unknown_to_its_registry_posts_every_minute() -> None:
    alone = EntriesPoster("n0", lambda: entry_notes(1))
    others = [record("m1", "f2"), record("m2", "f2")]  # another schedule only
    store = CountingStore()
    for minute in range(5):
        alone.sync(store, minute * ENTRIES_EVERY_MS, [], "f1")
    lost = EntriesPoster("n1", lambda: entry_notes(1))
    for minute in range(5):
        lost.sync(store, minute * ENTRIES_EVERY_MS, others, "f1")
    assert (alone.posts, lost.posts) == (5, 5)


def test_the_first_node_of_a_schedule_posts_at_its_start() -> None:
    store = CountingStore()
    alone = EntriesPoster("n0", lambda: entry_notes(1))
    alone.sync(store, 0, [record("n0")], "f1")  # itself only
    first = EntriesPoster("n1", lambda: entry_notes(1))
    first.sync(store, 0, [record("m1", "f2"), record("n1")], "f1")  # others run another
    joining = [EntriesPoster(f"n{i}", lambda: entry_notes(1)) for i in range(2, 12)]
    registry = [record("n0"), record("n1")]
    for node in joining:
        node.sync(store, 0, [*registry, record(node.node)], "f1")
    assert (alone.posts, first.posts) == (1, 1)
    # A node that joins a fleet on its schedule posts only if it is the minute's poster.
    for node in joining:
        chosen = poster([*registry, record(node.node)], "f1", 0)
        assert node.posts == (chosen == node.node), node.node
    assert sum(node.posts for node in joining) < len(joining) // 2


def test_a_node_that_is_not_the_poster_posts_only_when_it_is() -> None:
    registry = [record("a"), record("b")]
    minutes = range(1, 200)
    b_posts = [m for m in minutes if poster(registry, "f1", m) == "b"]
    node = EntriesPoster("a", lambda: entry_notes(1))
    store = CountingStore()
    node.sync(store, 0, registry, "f1")
    first = node.posts
    for minute in minutes:
        node.sync(store, minute * ENTRIES_EVERY_MS, registry, "f1")
        node.sync(store, minute * ENTRIES_EVERY_MS + 30_000, registry, "f1")
    assert b_posts  # the minutes of the other node exist, and are not this node's
    assert first == (poster(registry, "f1", 0) == "a")
    assert node.posts == first + len(minutes) - len(b_posts)


def test_a_big_post_is_sent_in_batches_and_finished_at_later_syncs() -> None:
    count = 2 * ENTRIES_BATCH + 500
    store = CountingStore()
    node = EntriesPoster("n0", lambda: entry_notes(count))
    node.sync(store, 0, [], "f1")
    syncs = 1
    while node.pending:
        node.sync(store, syncs * 1_000, [], "f1")
        syncs += 1
    assert syncs <= 3  # the budget holds at least a batch a sync
    assert store.posts == [ENTRIES_BATCH, ENTRIES_BATCH, 500]
    assert len(store.read_notes([KIND])[KIND]) == count
    assert node.posts == 1


def test_a_refused_batch_is_sent_again_at_the_next_sync() -> None:
    class Failing(CountingStore):
        fail = True

        def post(self, notes: Sequence[Note]) -> None:
            if self.fail:
                self.fail = False
                raise StoreError("refused")
            super().post(notes)

    store = Failing()
    node = EntriesPoster("n0", lambda: entry_notes(3))
    with pytest.raises(StoreError):
        node.sync(store, 0, [], "f1")
    assert len(node.pending) == 3
    node.sync(store, 1_000, [], "f1")
    assert not node.pending
    assert len(store.read_notes([KIND])[KIND]) == 3


def test_a_changed_schedule_is_posted_at_once_by_one_node_of_the_fleet() -> None:
    registry = [record(f"n{i}") for i in range(10)]
    nodes = [EntriesPoster(r.node, lambda: entry_notes(1)) for r in registry]
    store = CountingStore()
    minute = 7 * ENTRIES_EVERY_MS
    for node in nodes:
        node.sync(store, minute, registry, "f1")
    assert len(store.posts) == 1  # the minute's poster
    # A live edit: every node runs "f2" from its next sync, the registry still says "f1".
    for second in range(1, 5):
        for node in nodes:
            node.sync(store, minute + second * 1_000, registry, "f2")
    first = poster(registry, None, 7)
    # The node ranked first for the minute posted at the start and at the change; no other.
    assert {n.node: n.posts for n in nodes if n.posts} == {first: 2}
    assert len(store.posts) == 2
