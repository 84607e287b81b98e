"""Judging claims (``beatless.stores.base.judging``), on every store: a claim that asks
who holds a firing, answered as any claim is since a live claim decides first, and that
never wins a firing nobody holds. A node asks so about the firings a full or refusing
store kept it from judging, and about those it saw held by another node too late to take
them over (``beatless.node._judging``)."""

from __future__ import annotations

from stores import StoreFactory
from test_store_contract import HELD, LATE, LEASE_MS, LONG_LEASE_MS, LOST, WON, firing, ready

from beatless.stores import ClaimStore, Outcome
from beatless.stores.base import ClaimRequest, judging


def judge(store: ClaimStore, *requests: ClaimRequest, node: str = "judge") -> list[Outcome]:
    return store.claim([judging(r) for r in requests], node=node, lease_ms=LONG_LEASE_MS)


def test_a_judging_claim_tells_a_held_firing_a_committed_one_and_a_free_one_apart(
    store_factory: StoreFactory,
) -> None:
    holder, asker = store_factory(), store_factory()
    ready(store_factory, holder, asker)
    now = store_factory.now_ms()
    held, committed, free = firing(now), firing(now), firing(now)
    assert holder.claim([held, committed], node="a", lease_ms=LONG_LEASE_MS) == [WON, WON]
    assert holder.commit([committed.id], node="a") == [True]

    assert judge(asker, held, committed, free) == [HELD, LOST, LATE]
    # Nothing was written, nothing was taken: the holder keeps its claims, and the free
    # firing is a first win for the next claim.
    assert holder.commit([held.id], node="a") == [True]
    assert asker.claim([free], node="b", lease_ms=LEASE_MS) == [WON]


def test_a_judging_claim_never_wins_a_firing_whose_claim_was_released_or_never_made(
    store_factory: StoreFactory,
) -> None:
    holder, asker = store_factory(), store_factory()
    ready(store_factory, holder, asker)
    now = store_factory.now_ms()
    released, never = firing(now), firing(now)
    assert holder.claim([released], node="a", lease_ms=LONG_LEASE_MS) == [WON]
    holder.release([released.id], node="a")

    for node in ("a", "b"):
        assert judge(asker, released, never, node=node) == [LATE, LATE]
    assert asker.claim([never], node="b", lease_ms=LEASE_MS) == [WON]


def test_a_judging_claim_finds_a_firing_free_once_its_holders_lease_ran_out_uncommitted(
    store_factory: StoreFactory,
) -> None:
    """What a node that saw a firing held too late to take it over learns once the
    holder's lease has run out: ``missed`` if the holder never committed it."""
    holder, asker = store_factory(), store_factory()
    ready(store_factory, holder, asker)
    now = store_factory.now_ms()
    dropped, committed = firing(now), firing(now)
    assert holder.claim([dropped, committed], node="a", lease_ms=LEASE_MS) == [WON, WON]
    assert judge(asker, dropped, node="b") == [HELD]
    assert holder.commit([committed.id], node="a") == [True]

    store_factory.advance(LEASE_MS + 100)

    assert judge(asker, dropped, committed, node="b") == [LATE, LOST]


def test_a_judging_claim_of_the_asking_nodes_own_pending_claim_renews_it_as_its_holder(
    store_factory: StoreFactory,
) -> None:
    """The one claim a judging claim wins: the node's own, which it then releases."""
    store, other = store_factory(), store_factory()
    ready(store_factory, store, other)
    request = firing(store_factory.now_ms())
    assert store.claim([request], node="a", lease_ms=LONG_LEASE_MS) == [WON]

    assert judge(store, request, node="a") == [WON]
    assert judge(other, request, node="b") == [HELD]
    store.release([request.id], node="a")
    assert judge(other, request, node="b") == [LATE]
