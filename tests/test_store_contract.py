"""The claim-store contract (``beatless.stores.base``), run once for every store.

Each test opens its stores through ``store_factory`` (see ``tests/stores.py``): every
store it opens is another node's client of the same claims. Leases are short so that
a store with a server clock can run the suite by sleeping; the cases that need to
jump minutes, or to land on an exact millisecond, ask for a clock the test controls.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stores import StoreFactory

from beatless.errors import ConfigError
from beatless.node.runs import NEVER_LATE_MS, RUN_RECORD_MEMORY_MS
from beatless.schedule.firing import run_lease_id
from beatless.stores import ClaimRequest, ClaimStore, Outcome
from beatless.stores.base import TOLERANCE_MS

WON, TAKEOVER, LOST, HELD, LATE, EARLY, FOREIGN, OVERLAP = (
    Outcome.WON,
    Outcome.TAKEOVER,
    Outcome.LOST,
    Outcome.HELD,
    Outcome.LATE,
    Outcome.EARLY,
    Outcome.FOREIGN,
    Outcome.OVERLAP,
)
LEASE_MS = 600
LONG_LEASE_MS = 60_000
"""The lease of cases that hold a pending claim across several calls without asking it to
run out: a store under load (a Redis Cluster beside a parallel suite) can take longer
than ``LEASE_MS`` between two calls, and the claim would rightly be taken over."""
MAX_LATE_MS = 60_000
MEMORY_MS = 80_000
"""jitter 10 s + max_late 60 s + tolerance 10 s: what rule 5 asks of a store."""
OURS, THEIRS = "0a1b2c3d", "9f8e7d6c"
"""Task tags of two apps that share one store and namespace."""


def firing(
    occurrence_ms: int,
    *,
    max_late_ms: int = MAX_LATE_MS,
    memory_ms: int = MEMORY_MS,
    release_ms: int | None = None,
    tag: str = OURS,
    address: str | None = None,
) -> ClaimRequest:
    """A claim request for a firing no other test uses, released at its occurrence unless
    ``release_ms`` says otherwise, of the task tagged ``tag``, at an address of its own
    unless ``address`` names one."""
    id_ = str(uuid.uuid4())
    release = occurrence_ms if release_ms is None else release_ms
    address = f"contract/{id_[:8]}" if address is None else address
    return ClaimRequest(id_, address, occurrence_ms, max_late_ms, memory_ms, release, tag)


def of_task(request: ClaimRequest, tag: str) -> ClaimRequest:
    """The same firing (id, address, numbers), claimed for the task tagged ``tag``."""
    return dataclasses.replace(request, tag=tag)


def claim_one(
    store: ClaimStore, request: ClaimRequest, node: str, lease_ms: int = LEASE_MS
) -> Outcome:
    (outcome,) = store.claim([request], node=node, lease_ms=lease_ms)
    return outcome


def ready(factory: StoreFactory, *stores: ClaimStore) -> None:
    """Give each store its first claim (of a firing no case uses), so that the timed part
    of a case on a server clock times claims, not a store object's first call (the Redis
    Cluster store reads every bucket's epoch then)."""
    for store in stores:
        claim_one(store, firing(factory.now_ms()), "ready")


# -- exactly one winner --------------------------------------------------------------------


def test_exactly_one_of_many_nodes_wins_a_firing_and_the_others_are_held_off(
    store_factory: StoreFactory,
) -> None:
    stores = [store_factory() for _ in range(5)]
    request = firing(store_factory.now_ms())

    # A lease no run outlasts: the first claim of each store object opens its connection,
    # which on a loaded machine can take longer than LEASE_MS (the winner's lease would
    # then run out, and a later node rightly take it over).
    outcomes = [claim_one(s, request, f"node-{i}", LONG_LEASE_MS) for i, s in enumerate(stores)]

    assert outcomes == [WON, HELD, HELD, HELD, HELD]


def test_every_other_node_loses_a_firing_once_the_winner_committed(
    store_factory: StoreFactory,
) -> None:
    winner, *others = [store_factory() for _ in range(4)]
    request = firing(store_factory.now_ms())
    assert claim_one(winner, request, "node-0") is WON
    assert winner.commit([request.id], node="node-0") == [True]

    assert [claim_one(s, request, f"node-{i}") for i, s in enumerate(others, 1)] == [LOST] * 3


def test_exactly_one_node_wins_each_firing_when_threads_claim_concurrently(
    store_factory: StoreFactory,
) -> None:
    nodes = 6
    now = store_factory.now_ms()
    requests = [firing(now) for _ in range(150)]
    stores = [store_factory() for _ in range(nodes)]
    barrier = threading.Barrier(nodes)
    results: dict[str, list[tuple[str, Outcome]]] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        node, rng = f"node-{index}", random.Random(index)
        mine = rng.sample(requests, len(requests))
        got: list[tuple[str, Outcome]] = []
        try:
            barrier.wait(timeout=10)
            while mine:
                size = rng.randint(1, 20)
                batch, mine = mine[:size], mine[size:]
                outcomes = stores[index].claim(batch, node=node, lease_ms=LONG_LEASE_MS)
                got += [(r.id, o) for r, o in zip(batch, outcomes, strict=True)]
        except BaseException as exc:
            errors.append(exc)
        results[node] = got

    threads = [threading.Thread(target=run, args=(i,)) for i in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    won = [id_ for got in results.values() for id_, outcome in got if outcome is WON]
    assert sorted(won) == sorted(r.id for r in requests)
    others = {o for got in results.values() for _, o in got if o is not WON}
    assert others <= {HELD}


def test_claims_of_different_firings_are_independent(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    now = store_factory.now_ms()
    first, second = firing(now), firing(now)

    assert claim_one(a, first, "a", LONG_LEASE_MS) is WON
    assert claim_one(b, second, "b", LONG_LEASE_MS) is WON
    assert a.commit([first.id], node="a") == [True]
    b.release([second.id], node="b")

    assert claim_one(b, first, "b", LONG_LEASE_MS) is LOST
    assert claim_one(a, second, "a", LONG_LEASE_MS) is TAKEOVER


# -- lateness, on the store's clock ------------------------------------------------------


def test_claim_older_than_max_late_plus_tolerance_on_the_store_clock_is_late_and_writes_nothing(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    occurrence = store_factory.now_ms() - MAX_LATE_MS - TOLERANCE_MS - 2_000
    late = firing(occurrence)

    assert claim_one(store, late, "a", LONG_LEASE_MS) is LATE
    # Nothing was written: for a node allowed more lateness, the firing is still free.
    lenient = ClaimRequest(
        late.id, late.address, occurrence, MAX_LATE_MS + 10_000, MEMORY_MS, occurrence
    )
    assert claim_one(store_factory(), lenient, "b", LONG_LEASE_MS) is WON


def test_claim_at_exactly_max_late_plus_tolerance_is_not_late(
    clocked_store_factory: StoreFactory,
) -> None:
    store = clocked_store_factory()
    occurrence = clocked_store_factory.now_ms() - MAX_LATE_MS - TOLERANCE_MS

    assert claim_one(store, firing(occurrence), "a") is WON
    clocked_store_factory.advance(1)
    assert claim_one(store, firing(occurrence), "a") is LATE


def test_lateness_is_judged_by_the_store_clock_at_the_time_of_the_claim(
    clocked_store_factory: StoreFactory,
) -> None:
    store = clocked_store_factory()
    request = firing(clocked_store_factory.now_ms())

    clocked_store_factory.advance(MAX_LATE_MS + TOLERANCE_MS + 1)

    assert claim_one(store, request, "a") is LATE


# -- early, on the store's clock ------------------------------------------------------------


def test_claim_released_more_than_tolerance_ahead_of_the_store_clock_is_early_and_writes_nothing(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    ready(store_factory, a, b)
    now = store_factory.now_ms()
    request = firing(now, release_ms=now + TOLERANCE_MS + 400)

    assert claim_one(a, request, "a") is EARLY
    assert claim_one(b, request, "b") is EARLY
    # Nothing was written: at the right time the firing is won as a first win.
    store_factory.advance(800)
    assert claim_one(b, request, "b", LONG_LEASE_MS) is WON
    assert claim_one(a, request, "a") is HELD


def test_claim_released_exactly_tolerance_ahead_of_the_store_clock_is_not_early(
    clocked_store_factory: StoreFactory,
) -> None:
    store = clocked_store_factory()
    now = clocked_store_factory.now_ms()

    assert claim_one(store, firing(now, release_ms=now + TOLERANCE_MS), "a") is WON
    assert claim_one(store, firing(now, release_ms=now + TOLERANCE_MS + 1), "a") is EARLY


def test_a_late_firing_is_late_even_when_its_release_is_also_ahead(
    clocked_store_factory: StoreFactory,
) -> None:
    store = clocked_store_factory()
    now = clocked_store_factory.now_ms()
    request = firing(now - MAX_LATE_MS - TOLERANCE_MS - 1, release_ms=now + TOLERANCE_MS + 1)

    assert claim_one(store, request, "a", LONG_LEASE_MS) is LATE


# -- leases and takeovers ------------------------------------------------------------------


def test_pending_claim_whose_lease_ran_out_is_taken_over_by_another_node(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a") is WON

    store_factory.advance(LEASE_MS + 100)

    assert claim_one(b, request, "b") is TAKEOVER
    assert claim_one(a, request, "a") is HELD


def test_live_pending_claim_holds_off_another_node(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    ready(store_factory, a, b)
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a") is WON

    store_factory.advance(LEASE_MS // 3)

    assert claim_one(b, request, "b") is HELD


def test_pending_claim_is_live_through_the_last_millisecond_of_its_lease(
    clocked_store_factory: StoreFactory,
) -> None:
    a, b = clocked_store_factory(), clocked_store_factory()
    request = firing(clocked_store_factory.now_ms())
    assert claim_one(a, request, "a") is WON

    clocked_store_factory.advance(LEASE_MS)
    assert claim_one(b, request, "b") is HELD
    clocked_store_factory.advance(1)
    assert claim_one(b, request, "b") is TAKEOVER


def test_lease_that_ran_out_after_the_firing_became_late_gives_late_not_takeover(
    clocked_store_factory: StoreFactory,
) -> None:
    a, b = clocked_store_factory(), clocked_store_factory()
    request = firing(clocked_store_factory.now_ms())
    assert claim_one(a, request, "a") is WON

    clocked_store_factory.advance(MAX_LATE_MS + TOLERANCE_MS + 1)

    assert claim_one(b, request, "b") is LATE


def renewal_lease_ms(factory: StoreFactory) -> int:
    """The lease of the renewal cases: ``LEASE_MS`` on an exact clock; three times that on
    a server's clock, where the cases sleep, so that the margin each step has (a claim
    that must come before a lease ends, or after) outlasts a loaded machine's delays."""
    return LEASE_MS if factory.exact_clock else 3 * LEASE_MS


def test_reclaim_by_the_owner_of_a_pending_claim_is_won_again_and_renews_the_lease(
    store_factory: StoreFactory,
) -> None:
    lease = renewal_lease_ms(store_factory)
    a, b = store_factory(), store_factory()
    ready(store_factory, a, b)
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", lease) is WON

    store_factory.advance(lease // 2)
    assert claim_one(a, request, "a", lease) is WON
    store_factory.advance(lease * 2 // 3)  # past the first lease, inside the renewed one

    assert claim_one(b, request, "b", lease) is HELD
    assert a.commit([request.id], node="a") == [True]


def test_renewal_runs_the_lease_from_the_reclaim_so_no_node_takes_over_at_its_first_end(
    store_factory: StoreFactory,
) -> None:
    lease = renewal_lease_ms(store_factory)
    a, b = store_factory(), store_factory()
    ready(store_factory, a, b)
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", lease) is WON
    store_factory.advance(lease // 2)
    assert claim_one(a, request, "a", lease) is WON

    # Past the end of the first lease, well inside the renewed one.
    store_factory.advance(lease // 2 + lease // 6)
    assert claim_one(b, request, "b", lease) is HELD
    # Past the end of the renewed one: free.
    store_factory.advance(lease // 2)
    assert claim_one(b, request, "b", lease) is TAKEOVER
    assert a.commit([request.id], node="a") == [False]


def test_a_renewed_lease_lasts_lease_ms_from_the_reclaim_to_the_millisecond(
    clocked_store_factory: StoreFactory,
) -> None:
    a, b = clocked_store_factory(), clocked_store_factory()
    request = firing(clocked_store_factory.now_ms())
    assert claim_one(a, request, "a") is WON
    clocked_store_factory.advance(LEASE_MS // 3)
    assert claim_one(a, request, "a") is WON

    # Neither the first lease's end nor that end plus a lease: the reclaim plus a lease.
    clocked_store_factory.advance(LEASE_MS)
    assert claim_one(b, request, "b") is HELD
    clocked_store_factory.advance(1)
    assert claim_one(b, request, "b") is TAKEOVER


# -- commit ---------------------------------------------------------------------------------


def test_commit_keeps_the_claim_for_memory_ms_after_the_lease_would_have_run_out(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a") is WON
    assert a.commit([request.id], node="a") == [True]

    store_factory.advance(LEASE_MS + 100)

    assert claim_one(b, request, "b") is LOST


def test_commit_by_a_node_that_does_not_hold_the_claim_returns_false(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    request, unknown = firing(store_factory.now_ms()), firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON

    assert b.commit([request.id, unknown.id], node="b") == [False, False]
    assert a.commit([request.id], node="a") == [True]


def test_commit_after_a_takeover_returns_false_for_the_old_owner(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a") is WON
    store_factory.advance(LEASE_MS + 100)
    assert claim_one(b, request, "b") is TAKEOVER

    assert a.commit([request.id], node="a") == [False]
    assert b.commit([request.id], node="b") == [True]


def test_commit_returns_ownership_per_id_in_request_order(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    now = store_factory.now_ms()
    mine, theirs, nobodys = firing(now), firing(now), firing(now)
    assert claim_one(a, mine, "a", LONG_LEASE_MS) is WON
    assert claim_one(b, theirs, "b", LONG_LEASE_MS) is WON

    assert a.commit([theirs.id, mine.id, nobodys.id], node="a") == [False, True, False]


# -- release --------------------------------------------------------------------------------


def test_release_lets_another_node_take_the_firing_over(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON

    a.release([request.id], node="a")

    # The released claim is kept with its lease ended: a win after it is a takeover.
    assert claim_one(b, request, "b", LONG_LEASE_MS) is TAKEOVER
    assert claim_one(a, request, "a", LONG_LEASE_MS) is HELD
    assert b.commit([request.id], node="b") == [True]


def test_the_releasing_node_itself_takes_its_released_claim_over_and_cannot_commit_it(
    store_factory: StoreFactory,
) -> None:
    a = store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON

    a.release([request.id], node="a")
    a.release([request.id], node="a")

    assert a.commit([request.id], node="a") == [False]
    assert claim_one(a, request, "a", LONG_LEASE_MS) is TAKEOVER
    assert a.commit([request.id], node="a") == [True]


def test_a_released_claim_that_becomes_late_gives_late(
    clocked_store_factory: StoreFactory,
) -> None:
    a, b = clocked_store_factory(), clocked_store_factory()
    request = firing(clocked_store_factory.now_ms())
    assert claim_one(a, request, "a") is WON
    a.release([request.id], node="a")

    clocked_store_factory.advance(MAX_LATE_MS + TOLERANCE_MS + 1)

    assert claim_one(b, request, "b") is LATE


def test_release_by_a_node_that_does_not_hold_the_claim_does_nothing(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON

    b.release([request.id], node="b")

    assert claim_one(b, request, "b", LONG_LEASE_MS) is HELD
    assert a.commit([request.id], node="a") == [True]


def test_release_of_a_committed_claim_does_nothing(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON
    assert a.commit([request.id], node="a") == [True]

    a.release([request.id], node="a")

    assert claim_one(b, request, "b", LONG_LEASE_MS) is LOST


# -- batches --------------------------------------------------------------------------------


def test_batch_outcomes_follow_request_order_and_mix_every_outcome(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    now = store_factory.now_ms()
    abandoned, committed = firing(now), firing(now)
    assert claim_one(b, abandoned, "b") is WON
    assert claim_one(a, committed, "a") is WON
    assert a.commit([committed.id], node="a") == [True]
    store_factory.advance(LEASE_MS + 100)
    now = store_factory.now_ms()
    held_by_b, own_pending = firing(now), firing(now)
    assert claim_one(b, held_by_b, "b") is WON
    assert claim_one(a, own_pending, "a") is WON
    late = firing(now - MAX_LATE_MS - TOLERANCE_MS - 2_000)
    early = firing(now, release_ms=now + TOLERANCE_MS + 5_000)
    fresh = [firing(now), firing(now)]

    batch = [fresh[0], committed, late, held_by_b, abandoned, own_pending, early, fresh[1]]
    outcomes = a.claim(batch, node="a", lease_ms=LEASE_MS)

    assert outcomes == [WON, LOST, LATE, HELD, TAKEOVER, WON, EARLY, WON]


def test_the_same_firing_twice_in_one_batch_is_won_once_by_its_node(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())

    assert a.claim([request, request], node="a", lease_ms=LONG_LEASE_MS) == [WON, WON]
    assert claim_one(b, request, "b", LONG_LEASE_MS) is HELD


def test_empty_batches_do_nothing(store_factory: StoreFactory) -> None:
    store = store_factory()

    assert store.claim([], node="a", lease_ms=LEASE_MS) == []
    assert store.commit([], node="a") == []
    store.release([], node="a")


# -- task tags: another app under the same address ------------------------------------------


def test_a_live_claim_of_another_task_is_foreign_whether_pending_or_committed(
    store_factory: StoreFactory,
) -> None:
    ours, theirs = store_factory(), store_factory()
    request = firing(store_factory.now_ms(), tag=THEIRS)
    assert claim_one(theirs, request, "theirs", LONG_LEASE_MS) is WON

    assert claim_one(ours, of_task(request, OURS), "ours", LONG_LEASE_MS) is store_factory.foreign(
        HELD
    )
    assert theirs.commit([request.id], node="theirs") == [True]
    assert claim_one(ours, of_task(request, OURS), "ours", LONG_LEASE_MS) is store_factory.foreign(
        LOST
    )
    assert claim_one(ours, request, "ours", LONG_LEASE_MS) is LOST


def test_a_foreign_claim_writes_nothing(store_factory: StoreFactory) -> None:
    ours, theirs = store_factory(), store_factory()
    request = firing(store_factory.now_ms(), tag=THEIRS)
    assert claim_one(theirs, request, "theirs", LONG_LEASE_MS) is WON

    assert claim_one(ours, of_task(request, OURS), "ours", LONG_LEASE_MS) is store_factory.foreign(
        HELD
    )
    assert ours.commit([request.id], node="ours") == [False]

    assert claim_one(store_factory(), request, "third", LONG_LEASE_MS) is HELD
    assert theirs.commit([request.id], node="theirs") == [True]


def test_the_same_node_name_in_another_app_gets_foreign_not_its_own_pending_claim(
    store_factory: StoreFactory,
) -> None:
    first, second = store_factory(), store_factory()
    request = firing(store_factory.now_ms(), tag=THEIRS)
    assert claim_one(first, request, "host:1", LONG_LEASE_MS) is WON

    assert claim_one(second, of_task(request, OURS), "host:1", LONG_LEASE_MS) is FOREIGN
    assert claim_one(first, request, "host:1", LONG_LEASE_MS) is WON


def test_an_untagged_claim_or_request_is_never_foreign(store_factory: StoreFactory) -> None:
    a, b = store_factory(), store_factory()
    now = store_factory.now_ms()
    untagged, tagged = firing(now, tag=""), firing(now, tag=THEIRS)
    assert claim_one(a, untagged, "a", LONG_LEASE_MS) is WON
    assert claim_one(a, tagged, "a", LONG_LEASE_MS) is WON

    assert claim_one(b, of_task(untagged, OURS), "b", LONG_LEASE_MS) is HELD
    assert claim_one(b, of_task(tagged, ""), "b") is HELD


def test_a_claim_of_another_task_whose_lease_ran_out_is_free_and_taken_over(
    store_factory: StoreFactory,
) -> None:
    ours, theirs = store_factory(), store_factory()
    request = firing(store_factory.now_ms(), tag=THEIRS)
    assert claim_one(theirs, request, "theirs") is WON

    store_factory.advance(LEASE_MS + 100)

    assert claim_one(ours, of_task(request, OURS), "ours") is TAKEOVER
    assert claim_one(theirs, request, "theirs") is store_factory.foreign(HELD)
    assert ours.commit([request.id], node="ours") == [True]


def test_a_live_claim_of_another_task_is_foreign_even_once_the_firing_is_late(
    clocked_store_factory: StoreFactory,
) -> None:
    ours, theirs = clocked_store_factory(), clocked_store_factory()
    request = firing(clocked_store_factory.now_ms(), tag=THEIRS)
    assert claim_one(theirs, request, "theirs") is WON
    assert theirs.commit([request.id], node="theirs") == [True]

    clocked_store_factory.advance(MAX_LATE_MS + TOLERANCE_MS + 1)

    assert claim_one(ours, of_task(request, OURS), "ours") is FOREIGN
    assert claim_one(ours, request, "ours") is LOST


def test_foreign_outcomes_follow_request_order_in_a_mixed_batch(
    store_factory: StoreFactory,
) -> None:
    ours, theirs = store_factory(), store_factory()
    now = store_factory.now_ms()
    pending, committed, same_task, fresh = (firing(now, tag=THEIRS) for _ in range(4))
    assert (
        theirs.claim([pending, committed, same_task], node="theirs", lease_ms=LONG_LEASE_MS)
        == [WON] * 3
    )
    assert theirs.commit([committed.id], node="theirs") == [True]

    batch = [of_task(r, OURS) for r in (pending, fresh, committed)] + [same_task]
    outcomes = ours.claim(batch, node="ours", lease_ms=LONG_LEASE_MS)

    foreign = store_factory.foreign
    assert outcomes == [foreign(HELD), WON, foreign(LOST), HELD]


@pytest.mark.parametrize("tag", ["not hex", "0123456789abcdef0", "ab|cd"])
def test_a_tag_that_is_not_at_most_16_hex_digits_is_refused(tag: str) -> None:
    with pytest.raises(ConfigError, match="hex digits"):
        ClaimRequest("id", "ns/e", 0, 1, 2, 0, tag)


# -- run leases and overlap -----------------------------------------------------------------


def skipping(request: ClaimRequest) -> ClaimRequest:
    """The same firing, of an entry whose overlap policy is ``skip``: the request names
    its address's run lease."""
    return dataclasses.replace(request, run_id=run_lease_id(request.address))


def run_lease(address: str, now_ms: int) -> ClaimRequest:
    """The claim a worker makes of ``address``'s run lease while it runs a firing of it,
    as :mod:`beatless.node.runs` makes it."""
    return ClaimRequest(
        run_lease_id(address), address, now_ms, NEVER_LATE_MS, RUN_RECORD_MEMORY_MS, now_ms
    )


def start_run(store: ClaimStore, address: str, now_ms: int, lease_ms: int = LONG_LEASE_MS) -> None:
    """A worker starts a run of ``address``: it holds the run lease pending."""
    assert claim_one(store, run_lease(address, now_ms), "worker", lease_ms) is WON


def overlap(store: ClaimStore, otherwise: Outcome) -> Outcome:
    """``OVERLAP``, or what a store that does not check the run lease answers."""
    return OVERLAP if store.checks_overlap else otherwise


def test_a_firing_whose_address_runs_is_overlap_and_written_committed(
    store_factory: StoreFactory,
) -> None:
    worker, a, b = store_factory(), store_factory(), store_factory()
    now = store_factory.now_ms()
    request = skipping(firing(now))
    start_run(worker, request.address, now)

    assert claim_one(a, request, "a", LONG_LEASE_MS) is overlap(a, WON)
    # Written committed: no other node enqueues it, even once the run is over.
    lost = LOST if b.checks_overlap else HELD
    assert claim_one(b, request, "b", LONG_LEASE_MS) is lost
    worker.release([request.run_id], node="worker")
    assert claim_one(b, request, "b", LONG_LEASE_MS) is lost
    # The next firing of the address, once the run is over, is won.
    assert claim_one(b, skipping(firing(now, address=request.address)), "b") is WON


def test_overlap_is_answered_per_firing_in_a_mixed_batch(store_factory: StoreFactory) -> None:
    worker, a = store_factory(), store_factory()
    now = store_factory.now_ms()
    runs, idle = f"contract/{uuid.uuid4().hex[:8]}", f"contract/{uuid.uuid4().hex[:8]}"
    start_run(worker, runs, now)
    first, second = (skipping(firing(now + i, address=runs)) for i in range(2))
    allowed = firing(now + 2, address=runs)  # of an entry that allows overlap: no run_id
    elsewhere = skipping(firing(now, address=idle))

    outcomes = a.claim([first, elsewhere, allowed, second], node="a", lease_ms=LEASE_MS)

    assert outcomes == [overlap(a, WON), WON, WON, overlap(a, WON)]


@pytest.mark.parametrize("run", ["absent", "released", "lapsed", "committed"])
def test_a_run_lease_that_is_not_a_live_pending_claim_is_no_overlap(
    store_factory: StoreFactory, run: str
) -> None:
    worker, a, b = store_factory(), store_factory(), store_factory()
    now = store_factory.now_ms()
    request = skipping(firing(now))
    if run != "absent":
        start_run(worker, request.address, now, LEASE_MS)
    if run == "released":
        worker.release([request.run_id], node="worker")
    elif run == "committed":
        assert worker.commit([request.run_id], node="worker") == [True]
    elif run == "lapsed":
        store_factory.advance(LEASE_MS + 100)

    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON
    assert claim_one(b, request, "b") is HELD


def test_a_live_claim_of_the_firing_decides_before_overlap(store_factory: StoreFactory) -> None:
    worker, a, b = store_factory(), store_factory(), store_factory()
    now = store_factory.now_ms()
    request = skipping(firing(now))
    theirs = skipping(firing(now, tag=THEIRS, address=request.address))
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON
    assert claim_one(b, theirs, "b", LONG_LEASE_MS) is WON
    start_run(worker, request.address, now)

    # The holder's own pending claim is won again (renewed), not overlap.
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON
    assert claim_one(b, request, "b", LONG_LEASE_MS) is HELD
    assert claim_one(a, of_task(theirs, OURS), "a", LONG_LEASE_MS) is store_factory.foreign(HELD)
    assert a.commit([request.id], node="a") == [True]
    assert claim_one(b, request, "b", LONG_LEASE_MS) is LOST


def test_a_late_or_early_firing_is_refused_even_while_its_address_runs(
    store_factory: StoreFactory,
) -> None:
    worker, a = store_factory(), store_factory()
    now = store_factory.now_ms()
    address = f"contract/{uuid.uuid4().hex[:8]}"
    late_at = now - MAX_LATE_MS - TOLERANCE_MS - 2_000
    late = skipping(firing(late_at, address=address))
    early = skipping(firing(now, release_ms=now + TOLERANCE_MS + 5_000, address=address))
    start_run(worker, address, now)

    assert a.claim([late, early], node="a", lease_ms=LEASE_MS) == [LATE, EARLY]
    # Nothing was written: for a node allowed more lateness, the firing overlaps.
    lenient = dataclasses.replace(late, max_late_ms=MAX_LATE_MS + 10_000)
    assert claim_one(a, lenient, "a") is overlap(a, WON)


# -- identity, clock and probe --------------------------------------------------------------


def test_a_store_object_adopts_the_store_epoch_at_its_first_claim_and_keeps_it(
    store_factory: StoreFactory,
) -> None:
    a = store_factory()
    before = store_factory.now_ms()
    assert a.epoch is None

    assert claim_one(a, firing(before), "a", LONG_LEASE_MS) is WON
    epoch = a.epoch
    assert epoch is not None
    assert epoch.token
    assert epoch.started_ms <= store_factory.now_ms()
    b = store_factory()
    assert claim_one(b, firing(before), "b", LONG_LEASE_MS) is WON
    assert b.epoch == epoch
    assert claim_one(a, firing(before), "a", LONG_LEASE_MS) is WON
    assert a.epoch == epoch


def test_a_store_object_whose_first_call_is_a_commit_adopts_the_epoch_too(
    store_factory: StoreFactory,
) -> None:
    a = store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON
    b = store_factory()

    assert b.commit([request.id], node="a") == [True]

    assert b.epoch == a.epoch


def test_time_ms_reads_the_store_clock(store_factory: StoreFactory) -> None:
    store = store_factory()

    assert abs(store.time_ms() - store_factory.now_ms()) < 1_000


def test_time_ms_of_a_store_with_no_clock_of_its_own_is_its_clock_exactly(
    clocked_store_factory: StoreFactory,
) -> None:
    store = clocked_store_factory()
    clocked_store_factory.advance(1_234)

    assert store.time_ms() == clocked_store_factory.now_ms()


def test_probe_succeeds_on_a_healthy_store_and_leaves_the_claims_alone(
    store_factory: StoreFactory,
) -> None:
    a, b = store_factory(), store_factory()
    request = firing(store_factory.now_ms())
    assert claim_one(a, request, "a", LONG_LEASE_MS) is WON

    a.probe()
    b.probe()

    assert claim_one(b, request, "b", LONG_LEASE_MS) is HELD
    assert a.commit([request.id], node="a") == [True]


# -- memory (rule 5) ------------------------------------------------------------------------


def test_committed_claim_is_forgotten_after_memory_ms(clocked_store_factory: StoreFactory) -> None:
    a, b = clocked_store_factory(), clocked_store_factory()
    # A memory shorter than max_late + tolerance breaks rule 5; it shows the forgetting.
    request = firing(clocked_store_factory.now_ms(), memory_ms=5_000)
    assert claim_one(a, request, "a") is WON
    assert a.commit([request.id], node="a") == [True]

    clocked_store_factory.advance(5_000)
    assert claim_one(b, request, "b") is LOST
    clocked_store_factory.advance(1)
    assert claim_one(b, request, "b") is WON


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    max_late_ms=st.integers(1, 3_600_000),
    extra_memory_ms=st.integers(0, 600_000),
    claimed_after_ms=st.integers(0, 3_600_000),
    forgotten_after_ms=st.integers(1, 600_000),
)
def test_a_claim_forgotten_after_a_memory_covering_max_late_and_tolerance_comes_back_late(
    clocked_store_factory: StoreFactory,
    max_late_ms: int,
    extra_memory_ms: int,
    claimed_after_ms: int,
    forgotten_after_ms: int,
) -> None:
    store = clocked_store_factory()
    memory_ms = max_late_ms + TOLERANCE_MS + extra_memory_ms
    occurrence = clocked_store_factory.now_ms() - min(claimed_after_ms, max_late_ms + TOLERANCE_MS)
    request = firing(occurrence, max_late_ms=max_late_ms, memory_ms=memory_ms)
    assert claim_one(store, request, "a") is WON
    assert store.commit([request.id], node="a") == [True]

    clocked_store_factory.advance(memory_ms + forgotten_after_ms)

    assert claim_one(store, request, "b") is LATE
