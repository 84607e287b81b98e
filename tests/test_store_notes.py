"""The notes of the claim-store contract (``beatless.stores.base``), run on every store.

Notes are the small records nodes keep beside their claims: the registry, history and
controls. Each test uses kinds of its own, so that tests sharing one server never see
each other's notes.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from stores import StoreFactory

from beatless.errors import ConfigError
from beatless.stores import ClaimStore
from beatless.stores.base import NOTE_NAME_LIMIT, NOTE_VALUE_LIMIT, Note

LONG_MS = 600_000


def kind(label: str = "k") -> str:
    """A kind no other test uses."""
    return f"contract-notes/{uuid.uuid4().hex[:12]}/{label}"


def test_a_posted_note_is_read_by_every_client_of_the_store(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    nodes = kind("nodes")
    a.post([Note(nodes, "node-a", '{"pid": 1}', LONG_MS)])
    b.post([Note(nodes, "node-b", '{"pid": 2}', LONG_MS)])

    assert b.read_notes([nodes]) == {nodes: {"node-a": '{"pid": 1}', "node-b": '{"pid": 2}'}}
    assert a.read_notes([nodes]) == b.read_notes([nodes])


def test_a_post_replaces_the_note_of_the_same_kind_and_key(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    nodes = kind()
    a.post([Note(nodes, "n", "first", LONG_MS)])
    b.post([Note(nodes, "n", "second", LONG_MS)])

    assert a.read_notes([nodes]) == {nodes: {"n": "second"}}


def test_kinds_are_kept_apart_and_a_kind_without_notes_reads_empty(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    one, two, empty = kind("one"), kind("two"), kind("empty")
    store.post([Note(one, "same-key", "1", LONG_MS), Note(two, "same-key", "2", LONG_MS)])

    assert store.read_notes([one, two, empty]) == {
        one: {"same-key": "1"},
        two: {"same-key": "2"},
        empty: {},
    }
    assert store.read_notes([]) == {}


def test_a_note_lives_its_ttl_on_the_store_clock_and_is_not_read_after(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    nodes = kind()
    store.post([Note(nodes, "short", "s", 400), Note(nodes, "long", "l", LONG_MS)])
    store_factory.advance(150)
    assert store.read_notes([nodes]) == {nodes: {"short": "s", "long": "l"}}

    store_factory.advance(650)

    assert store.read_notes([nodes]) == {nodes: {"long": "l"}}


def test_a_note_lives_through_the_last_millisecond_of_its_ttl(
    clocked_store_factory: StoreFactory,
) -> None:
    store = clocked_store_factory()
    nodes = kind()
    store.post([Note(nodes, "n", "v", 1_000)])

    clocked_store_factory.advance(1_000)
    assert store.read_notes([nodes]) == {nodes: {"n": "v"}}
    clocked_store_factory.advance(1)
    assert store.read_notes([nodes]) == {nodes: {}}


def test_reposting_a_note_renews_its_ttl(store_factory: StoreFactory) -> None:
    store = store_factory()
    nodes = kind()
    store.post([Note(nodes, "n", "v1", 500)])
    store_factory.advance(300)
    store.post([Note(nodes, "n", "v2", 500)])
    store_factory.advance(300)

    assert store.read_notes([nodes]) == {nodes: {"n": "v2"}}


def test_keep_bounds_a_kind_to_the_notes_that_expire_last(store_factory: StoreFactory) -> None:
    store = store_factory()
    history = kind("history")
    # Distinct time-to-live values make the order certain on every clock.
    store.post([Note(history, f"f{i}", str(i), LONG_MS + i * 10_000, keep=3) for i in range(5)])
    assert store.read_notes([history]) == {history: {"f2": "2", "f3": "3", "f4": "4"}}

    store.post([Note(history, "f9", "9", LONG_MS + 90_000, keep=3)])

    assert store.read_notes([history]) == {history: {"f3": "3", "f4": "4", "f9": "9"}}


def test_keep_counts_a_replaced_note_once(store_factory: StoreFactory) -> None:
    store = store_factory()
    history = kind()
    for _ in range(4):
        store.post([Note(history, "same", "v", LONG_MS, keep=2)])
    store.post([Note(history, "other", "w", LONG_MS + 1_000, keep=2)])

    assert store.read_notes([history]) == {history: {"same": "v", "other": "w"}}


def test_keep_leaves_other_kinds_alone(store_factory: StoreFactory) -> None:
    store = store_factory()
    bounded, free = kind("bounded"), kind("free")
    store.post([Note(free, f"k{i}", "x", LONG_MS) for i in range(6)])
    store.post([Note(bounded, f"k{i}", "x", LONG_MS + i * 1_000, keep=2) for i in range(6)])

    notes = store.read_notes([bounded, free])

    assert sorted(notes[bounded]) == ["k4", "k5"]
    assert len(notes[free]) == 6


def test_any_text_is_kept_as_posted(store_factory: StoreFactory) -> None:
    store = store_factory()
    odd_kind = kind("ns with spaces/entry.名前/tenant:*>?#{}")
    odd_key = "key with spaces.and/slashes*>|"
    value = json.dumps({"entry": "ünïcode ✓", "quote": "'\"", "newline": "a\nb"})
    long_key = "k" * NOTE_NAME_LIMIT
    big_value = "v" * NOTE_VALUE_LIMIT
    store.post(
        [
            Note(odd_kind, odd_key, value, LONG_MS),
            Note(odd_kind, long_key, big_value, LONG_MS),
            Note(odd_kind, "empty", "", LONG_MS),
        ]
    )

    assert store.read_notes([odd_kind]) == {
        odd_kind: {odd_key: value, long_key: big_value, "empty": ""}
    }


def test_many_notes_in_one_post_and_many_kinds_in_one_read(store_factory: StoreFactory) -> None:
    store = store_factory()
    kinds = [kind(f"k{i}") for i in range(20)]
    store.post([Note(k, f"key{j}", f"{k}:{j}", LONG_MS) for k in kinds for j in range(10)])

    notes = store.read_notes(kinds)

    assert notes == {k: {f"key{j}": f"{k}:{j}" for j in range(10)} for k in kinds}


def test_notes_posted_at_once_by_many_clients_are_all_kept(store_factory: StoreFactory) -> None:
    stores = [store_factory() for _ in range(4)]
    nodes = kind()
    barrier = threading.Barrier(len(stores))

    def heartbeat(store: ClaimStore, i: int) -> None:
        barrier.wait()
        for beat in range(5):
            store.post([Note(nodes, f"node-{i}", str(beat), LONG_MS)])

    threads = [threading.Thread(target=heartbeat, args=(s, i)) for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert stores[0].read_notes([nodes]) == {nodes: {f"node-{i}": "4" for i in range(4)}}


def test_notes_do_not_touch_claims(store_factory: StoreFactory) -> None:
    from test_store_contract import WON, claim_one, firing

    store = store_factory()
    request = firing(store_factory.now_ms())
    store.post([Note(request.id, request.id, "x", LONG_MS), Note(kind(), request.id, "y", 1)])

    assert claim_one(store, request, "a") is WON


# -- logged notes ----------------------------------------------------------------------


def logged(kind_: str, key: str, value: str, ttl_ms: int, keep: int = 3) -> Note:
    return Note(kind_, key, value, ttl_ms, keep, logged=True)


def test_logged_notes_are_read_as_the_last_keep_of_their_kind(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    history = kind("history")
    # Posted in the order they expire, as a history posts them.
    a.post([logged(history, f"f{i}", str(i), LONG_MS + i * 10_000) for i in range(4)])
    b.post([logged(history, "f4", "4", LONG_MS + 40_000)])

    assert b.read_logs([history]) == {history: {"f2": "2", "f3": "3", "f4": "4"}}
    assert a.read_logs([history]) == b.read_logs([history])


def test_a_logged_note_posted_again_reads_its_last_value(store_factory: StoreFactory) -> None:
    store = store_factory()
    history = kind()
    store.post([logged(history, "f1", "first", LONG_MS), logged(history, "f2", "x", LONG_MS + 1)])
    store.post([logged(history, "f1", "second", LONG_MS + 2)])

    assert store.read_logs([history]) == {history: {"f1": "second", "f2": "x"}}


def test_a_logged_note_lives_its_ttl(store_factory: StoreFactory) -> None:
    store = store_factory()
    history = kind()
    store.post([logged(history, "short", "s", 400), logged(history, "long", "l", LONG_MS)])
    store_factory.advance(150)
    assert store.read_logs([history]) == {history: {"short": "s", "long": "l"}}

    store_factory.advance(650)

    assert store.read_logs([history]) == {history: {"long": "l"}}


def test_read_logs_reads_notes_posted_in_place_and_logged_alike(
    store_factory: StoreFactory,
) -> None:
    old, new = store_factory(), store_factory()
    history, other = kind("history"), kind("other")
    # A fleet mid-rollout: one node posts the kind in place, another logs it.
    old.post([Note(history, "f1", "1", LONG_MS, keep=3), Note(other, "o", "in place", LONG_MS)])
    new.post([logged(history, "f2", "2", LONG_MS + 1), logged(other, "p", "logged", LONG_MS)])

    empty = kind("empty")

    assert old.read_logs([history, other, empty]) == {
        history: {"f1": "1", "f2": "2"},
        other: {"o": "in place", "p": "logged"},
        empty: {},
    }
    assert new.read_logs([]) == {}


def test_notes_posted_in_place_before_a_log_are_bounded_with_it(
    store_factory: StoreFactory,
) -> None:
    """A fleet's first history is posted in place, the rest logged: once more than
    ``keep`` notes were logged, the kind reads as its last ``keep`` over both, never the
    first notes beside the latest with a hole between (a reader would take the hole for
    firings nobody sent)."""
    store = store_factory()
    history = kind("history")
    store.post([Note(history, f"f{i}", str(i), LONG_MS + i, keep=3) for i in range(2)])
    store.post([logged(history, f"f{i}", str(i), LONG_MS + i) for i in range(2, 8)])

    assert store.read_logs([history]) == {history: {"f5": "5", "f6": "6", "f7": "7"}}


def test_a_commit_posts_its_logged_notes(store_factory: StoreFactory) -> None:
    from test_store_contract import WON, claim_one, firing

    store = store_factory()
    history = kind()
    request = firing(store_factory.now_ms())
    assert claim_one(store, request, "a") is WON

    assert store.commit(
        [request.id], node="a", notes=[logged(history, request.id, "sent", LONG_MS)]
    )

    assert store.read_logs([history]) == {history: {request.id: "sent"}}


def test_a_logged_note_needs_a_keep() -> None:
    with pytest.raises(ConfigError, match="at least 1 for a logged note"):
        Note("k", "k", "v", 1_000, logged=True)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"kind": ""}, "kind"),
        ({"key": ""}, "key"),
        ({"key": "x" * (NOTE_NAME_LIMIT + 1)}, "key"),
        ({"kind": "a\x00b"}, "NUL"),
        ({"value": "é" * (NOTE_VALUE_LIMIT // 2 + 1)}, "bytes"),
        ({"ttl_ms": 0}, "ttl_ms"),
        ({"keep": -1}, "keep"),
    ],
)
def test_a_bad_note_is_refused_with_what_is_wrong(fields: dict[str, object], words: str) -> None:
    values: dict[str, object] = {"kind": "k", "key": "k", "value": "v", "ttl_ms": 1_000}
    values.update(fields)
    with pytest.raises(ConfigError, match=words):
        Note(**values)  # type: ignore[arg-type]


def test_a_store_that_keeps_notes_a_limited_time_refuses_a_longer_ttl(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    notes = kind()
    live = store.notes_live_ms
    if live is None:
        store.post([Note(notes, "long", "v", 10 * 365 * 86_400_000)])  # any ttl is kept
        assert store.read_notes([notes]) == {notes: {"long": "v"}}
        return
    store.post([Note(notes, "at-the-limit", "v", live)])
    with pytest.raises(ConfigError, match="ttl_ms"):
        store.post([Note(notes, "over", "v", live + 1)])
    assert store.read_notes([notes]) == {notes: {"at-the-limit": "v"}}
