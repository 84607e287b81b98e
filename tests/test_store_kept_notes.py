"""Kept notes of the claim-store contract (``beatless.stores.base``): notes with no end,
replaced or deleted only. Every store that keeps them passes this suite; RabbitMQ, whose
notes live at most 24 hours, refuses with its reason and names the stores that can."""

from __future__ import annotations

import uuid

import pytest
from stores import StoreFactory

from beatless.errors import ConfigError
from beatless.stores import ClaimStore
from beatless.stores.base import KEEPING_STORES, NOTE_NAME_LIMIT, NOTE_VALUE_LIMIT, KeptNote, Note


def kind(label: str = "k") -> str:
    """A kind no other test uses."""
    return f"contract-kept/{uuid.uuid4().hex[:12]}/{label}"


def keeping(factory: StoreFactory) -> ClaimStore:
    store = factory()
    if not store.keeps_notes:
        pytest.skip(f"the {store.name} store does not keep notes (tested below)")
    return store


def test_a_kept_note_is_read_by_every_client_replaced_and_deleted(
    store_factory: StoreFactory,
) -> None:
    a = keeping(store_factory)
    b = store_factory()
    entries = kind("entries")
    a.keep_notes([KeptNote(entries, "x", "1"), KeptNote(entries, "y", "é" * 10)])
    b.keep_notes([KeptNote(entries, "x", "2")])

    assert b.read_kept(entries) == {"x": "2", "y": "é" * 10}
    assert a.read_kept(entries, ["y", "missing"]) == {"y": "é" * 10}
    assert a.read_kept(entries, []) == {}

    b.delete_kept(entries, ["x", "missing"])
    assert a.read_kept(entries) == {"y": "é" * 10}
    a.delete_kept(entries, ["y"])
    assert b.read_kept(entries) == {}
    a.delete_kept(entries, [])


def test_kept_notes_outlive_any_time_to_live_and_are_apart_from_notes(
    store_factory: StoreFactory,
) -> None:
    store = keeping(store_factory)
    same = kind("same")
    store.post([Note(same, "n", "expires", 200)])
    store.keep_notes([KeptNote(same, "n", "kept"), KeptNote(kind("other"), "n", "other")])
    store_factory.advance(600)

    assert store.read_notes([same]) == {same: {}}
    assert store.read_kept(same) == {"n": "kept"}
    assert store.read_kept(kind("never")) == {}


def test_the_last_of_a_batch_wins_and_kinds_are_kept_apart(store_factory: StoreFactory) -> None:
    store = keeping(store_factory)
    one, two = kind("one"), kind("two")
    store.keep_notes([KeptNote(one, "k", "a"), KeptNote(two, "k", "b"), KeptNote(one, "k", "c")])

    assert store.read_kept(one) == {"k": "c"}
    assert store.read_kept(two) == {"k": "b"}


def test_a_kept_note_holds_the_longest_names_and_value(store_factory: StoreFactory) -> None:
    store = keeping(store_factory)
    long_kind = kind() + "k" * (NOTE_NAME_LIMIT - len(kind()))
    key, value = "é" * NOTE_NAME_LIMIT, "v" * NOTE_VALUE_LIMIT
    store.keep_notes([KeptNote(long_kind, key, value)])

    assert store.read_kept(long_kind) == {key: value}


def test_kept_notes_refuse_names_and_values_beyond_the_limits() -> None:
    with pytest.raises(ConfigError, match="without NUL"):
        KeptNote("a\x00b", "k", "v")
    with pytest.raises(ConfigError, match="bytes is over"):
        KeptNote("kind", "k", "v" * (NOTE_VALUE_LIMIT + 1))


def test_a_store_that_cannot_keep_notes_refuses_naming_why_and_the_stores_that_can(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    if store.keeps_notes:
        assert store.name in KEEPING_STORES
        return
    for call in (
        lambda: store.keep_notes([KeptNote(kind(), "k", "v")]),
        lambda: store.read_kept(kind()),
        lambda: store.delete_kept(kind(), ["k"]),
    ):
        with pytest.raises(ConfigError, match="cannot keep notes") as refused:
            call()
        assert "24 hours" in str(refused.value)
        assert all(name in str(refused.value) for name in KEEPING_STORES)


def test_a_sync_reads_notes_and_the_kept_notes_asked_in_one_call(
    store_factory: StoreFactory,
) -> None:
    a = keeping(store_factory)
    b = store_factory()
    notes, kept, other = kind("notes"), kind("kept"), kind("other")
    a.post([Note(notes, "n", "1", 60_000)])
    a.keep_notes(
        [KeptNote(kept, "head", "h"), KeptNote(kept, "7", "r7"), KeptNote(other, "x", "y")]
    )

    read, found = b.read_synced([notes, kind("none")], {kept: ["head", "8", "7"], other: []})

    assert read[notes] == {"n": "1"}
    assert found == {kept: {"head": "h", "7": "r7"}, other: {}}
    assert b.read_synced([], {kept: ["head"]}) == ({}, {kept: {"head": "h"}})


def test_a_sync_posts_its_own_notes_and_reads_them_back_in_one_call(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    mine, kept = kind("mine"), kind("kept")
    asked: dict[str, list[str]] = {}
    if a.keeps_notes:
        a.keep_notes([KeptNote(kept, "head", "h")])
        asked = {kept: ["head"]}
    for second in range(3):  # posted again at each sync, as a node's progress is
        note = Note(mine, "progress", f"p{second}", 60_000)
        read, found = a.post_and_read([note], [mine, kind("none")], asked)
        assert read[mine] == {"progress": f"p{second}"}
        assert found == {name: {"head": "h"} for name in asked}
        assert b.read_notes([mine]) == {mine: {"progress": f"p{second}"}}
    assert a.post_and_read([], [mine], {}) == ({mine: {"progress": "p2"}}, {})
