"""The re-seeding rule of the claim-store contract ("Re-seeding" in ``beatless.stores.base``),
run once for every store that can be made to lose its memory in a test.

A store object that holds off answers ``RESEEDING`` and writes nothing for a firing the
loss made unknown; a node writes back what it sent with ``reseed`` (committed: lost to
everyone); once settled, the store object judges a firing still absent as new.
"""

from __future__ import annotations

from stores import StoreFactory
from test_store_contract import LEASE_MS, claim_one, firing

from beatless.stores import ClaimRequest, ClaimStore, Outcome

WON, LOST, FORGOTTEN, RESEEDING = Outcome.WON, Outcome.LOST, Outcome.FORGOTTEN, Outcome.RESEEDING


def holding_off(store: ClaimStore) -> ClaimStore:
    assert store.reseeds, f"the {store.name} store does not re-seed"
    store.holds_off = True
    return store


def seen(factory: StoreFactory, *stores: ClaimStore) -> None:
    """Give each store object a first claim, so that it has seen the epoch before the loss."""
    for store in stores:
        assert claim_one(store, firing(factory.now_ms()), "ready") is WON


def sent_by(store: ClaimStore, factory: StoreFactory, node: str) -> ClaimRequest:
    """A firing ``node`` won and committed through ``store`` (its message sent)."""
    request = firing(factory.now_ms())
    assert claim_one(store, request, node) is WON
    assert store.commit([request.id], node=node) == [True]
    return request


def test_a_store_object_that_holds_off_writes_nothing_for_a_firing_released_before_the_loss(
    store_factory: StoreFactory,
) -> None:
    a = holding_off(store_factory())
    sent = sent_by(a, store_factory, "a")

    store_factory.lose_memory()
    unsent = firing(store_factory.now_ms())

    assert a.claim([sent, unsent], node="a", lease_ms=LEASE_MS) == [RESEEDING, RESEEDING]
    assert a.forgot_before_ms is not None
    # Nothing was written: a store object that never saw the old epoch wins it (RabbitMQ
    # took the slot and gave it back: a takeover).
    assert claim_one(store_factory(), unsent, "c").is_won


def test_a_store_object_that_does_not_hold_off_forgets_as_before(
    store_factory: StoreFactory,
) -> None:
    a = store_factory()
    seen(store_factory, a)
    store_factory.lose_memory()
    unsent = firing(store_factory.now_ms())

    assert claim_one(a, unsent, "a") is FORGOTTEN
    assert claim_one(store_factory(), unsent, "c") is LOST


def test_a_firing_written_back_is_lost_to_every_node_and_an_absent_one_is_won_once_settled(
    store_factory: StoreFactory,
) -> None:
    a, b = holding_off(store_factory()), holding_off(store_factory())
    seen(store_factory, a, b)
    sent = sent_by(a, store_factory, "a")

    store_factory.lose_memory()
    unsent = firing(store_factory.now_ms())
    assert b.claim([sent, unsent], node="b", lease_ms=LEASE_MS) == [RESEEDING, RESEEDING]

    # a writes back what it sent: committed, so no node sends it again.
    assert a.reseed([sent], node="a", lease_ms=LEASE_MS) == [FORGOTTEN]
    assert a.epoch == b.epoch
    assert b.claim([sent, unsent], node="b", lease_ms=LEASE_MS) == [LOST, RESEEDING]

    # Every node wrote back: b settles the epoch, and what is absent was sent by nobody.
    assert b.epoch is not None
    assert b.settle(b.epoch)
    assert b.forgot_before_ms is None
    again = b.claim([sent, unsent], node="b", lease_ms=LEASE_MS)
    assert again[0] is LOST
    assert again[1].is_won
    assert claim_one(a, unsent, "a") is Outcome.HELD


def test_a_firing_held_on_the_new_epoch_is_not_held_off(store_factory: StoreFactory) -> None:
    a, b = holding_off(store_factory()), holding_off(store_factory())
    seen(store_factory, a, b)
    store_factory.lose_memory()
    request = firing(store_factory.now_ms())
    assert a.reseed([request], node="a", lease_ms=LEASE_MS) == [FORGOTTEN]

    assert claim_one(b, request, "b") is LOST


def test_settling_an_epoch_the_store_object_no_longer_sees_keeps_the_horizon(
    store_factory: StoreFactory,
) -> None:
    a = holding_off(store_factory())
    seen(store_factory, a)
    old = a.epoch
    assert old is not None
    store_factory.lose_memory()
    assert claim_one(a, firing(store_factory.now_ms()), "a") is RESEEDING

    assert not a.settle(old)
    assert a.forgot_before_ms is not None
    assert claim_one(a, firing(store_factory.now_ms()), "a") is RESEEDING
