"""``commit(ids, node=..., notes=...)``: the notes a commit carries (each firing's history
item) are written in the commit's own operation, on every store."""

from __future__ import annotations

import uuid

from stores import StoreFactory
from test_store_contract import LONG_LEASE_MS, WON, claim_one, firing

from beatless.stores.base import Note

LONG_MS = 600_000
"""How long the notes are kept; the claims are held with ``LONG_LEASE_MS`` so that a
loaded store (a Redis Cluster beside a parallel suite) does not let one run out between
the claim and the commit."""


def kind() -> str:
    return f"contract-commit-notes/{uuid.uuid4().hex[:12]}"


def test_a_commit_writes_its_notes_for_every_client_to_read(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    history = kind()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON

    kept = a.commit([request.id], node="a", notes=[Note(history, request.id, "sent", LONG_MS)])

    assert kept == [True]
    assert b.read_notes([history]) == {history: {request.id: "sent"}}


def test_the_notes_of_a_commit_are_bounded_like_any_post(store_factory: StoreFactory) -> None:
    store = store_factory()
    history = kind()
    store.post([Note(history, f"old{i}", "x", LONG_MS + i, keep=2) for i in range(2)])
    request = firing(store_factory.now_ms())
    assert claim_one(store, request, "a", LONG_LEASE_MS) is WON

    store.commit(
        [request.id], node="a", notes=[Note(history, request.id, "new", LONG_MS + 90_000, keep=2)]
    )

    assert store.read_notes([history]) == {history: {"old1": "x", request.id: "new"}}


def test_notes_are_written_even_for_a_claim_that_is_not_this_nodes(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    history = kind()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON

    kept = b.commit([request.id], node="b", notes=[Note(history, "k", "v", LONG_MS)])

    assert kept == [False]
    assert a.read_notes([history]) == {history: {"k": "v"}}
    assert a.commit([request.id], node="a") == [True]  # still a's pending claim


def test_a_commit_without_notes_and_notes_without_ids_each_do_their_part(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    history = kind()
    request = firing(store_factory.now_ms())
    assert claim_one(store, request, "a", LONG_LEASE_MS) is WON

    assert store.commit([request.id], node="a", notes=[]) == [True]
    assert store.commit([], node="a", notes=[Note(history, "alone", "v", LONG_MS)]) == []

    assert store.read_notes([history]) == {history: {"alone": "v"}}
