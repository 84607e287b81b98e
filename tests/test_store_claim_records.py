"""Claim records (``beatless.stores.base``, "Claim records"): every store that reads its
claims keeps the live revision each claim carried, through renewal, commit and takeover,
and reads it back with :meth:`~beatless.stores.base.ClaimStore.claim_records`, so that
``beatless explain --store`` can say which revision a firing ran under. Run once for every
store; the records an earlier beatless wrote are read in the tests of each store."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from stores import StoreFactory

from beatless.stores import ClaimRequest, ClaimStore, Outcome

LEASE_MS = 60_000
MAX_LATE_MS = 60_000
MEMORY_MS = 80_000


def firing(now_ms: int, revision: int | None) -> ClaimRequest:
    """A claim of a firing no other test uses, by a node that had applied ``revision``."""
    id_ = str(uuid.uuid4())
    address = f"rec{id_[:8]}/e"
    return ClaimRequest(
        id_, address, now_ms, MAX_LATE_MS, MEMORY_MS, now_ms, "ab", revision=revision
    )


def reading(factory: StoreFactory) -> ClaimStore:
    store = factory()
    if not store.reads_claims:
        assert factory.backend.name == "rabbitmq"  # its slots cannot be read undisturbed
        pytest.skip(f"the {store.name} store does not read claims")
    return store


def claim(store: ClaimStore, request: ClaimRequest, node: str) -> Outcome:
    return store.claim([request], node=node, lease_ms=LEASE_MS)[0]


def test_a_claim_record_names_its_node_state_and_the_revision_its_claim_carried(
    store_factory: StoreFactory,
) -> None:
    store = reading(store_factory)
    now = store.time_ms()
    live, plain = firing(now, 7), firing(now, None)
    assert store.claim([live, plain], node="n1", lease_ms=LEASE_MS) == [Outcome.WON] * 2
    records = store.claim_records([live.id, plain.id, "never-claimed"])
    assert set(records) == {live.id, plain.id}
    pending = records[live.id]
    assert (pending.node, pending.committed, pending.revision) == ("n1", False, 7)
    assert now <= pending.until_ms - LEASE_MS <= store.time_ms()
    assert (records[plain.id].node, records[plain.id].revision) == ("n1", None)
    assert store.commit([live.id], node="n1") == [True]
    (committed,) = store.claim_records([live.id]).values()
    assert (committed.node, committed.committed, committed.revision) == ("n1", True, 7)


def test_a_renewal_or_a_takeover_records_the_revision_of_the_claim_that_wrote_last(
    store_factory: StoreFactory,
) -> None:
    store, other = reading(store_factory), store_factory()
    now = store.time_ms()
    request = firing(now, 3)
    assert claim(store, request, "n1") is Outcome.WON
    assert claim(store, dataclasses.replace(request, revision=4), "n1") is Outcome.WON
    assert store.claim_records([request.id])[request.id].revision == 4
    store.release([request.id], node="n1")
    assert claim(other, dataclasses.replace(request, revision=5), "n2") is Outcome.TAKEOVER
    record = other.claim_records([request.id])[request.id]
    assert (record.node, record.committed, record.revision) == ("n2", False, 5)
    # A node that read the record elsewhere reads the same: it is the store's, not a cache.
    assert store.claim_records([request.id]) == {request.id: record}


def test_a_node_whose_name_looks_like_a_record_field_reads_back_as_written(
    store_factory: StoreFactory,
) -> None:
    store = reading(store_factory)
    request = firing(store.time_ms(), 12)
    node = "host|v=2|pending|9|12"
    assert claim(store, request, node) is Outcome.WON
    assert claim(store, request, node) is Outcome.WON  # its own pending claim, renewed
    record = store.claim_records([request.id])[request.id]
    assert (record.node, record.revision) == (node, 12)
    assert store.commit([request.id], node=node) == [True]
