"""Rule 6 of live entries in the claim (``beatless.stores.base``, "Live revisions"): a
claim carrying a live revision older than one in force at its occurrence is answered
``STALE`` by the stores whose claim is a script or a transaction, and never by NATS or
RabbitMQ, which leave rule 6 to the nodes' propagation rule. Run once for every store."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from stores import StoreFactory

from beatless.live.codec import dumps
from beatless.live.revisions import Revision
from beatless.stores import ClaimRequest, ClaimStore, Outcome
from beatless.stores._fences import revisions_kind
from beatless.stores.base import KeptNote

CHECKING = {"memory", "traffic", "sqlite", "redis", "redis-cluster", "postgres"}
LEASE_MS = 60_000
MAX_LATE_MS = 60_000
MEMORY_MS = 80_000


def namespace() -> str:
    return f"rev{uuid.uuid4().hex[:10]}"


def firing(ns: str, occurrence_ms: int, revision: int | None) -> ClaimRequest:
    """A claim of a firing of namespace ``ns`` no other test uses, by a node that had
    applied live revision ``revision``."""
    id_ = str(uuid.uuid4())
    return ClaimRequest(
        id_,
        f"{ns}/e{id_[:6]}",
        occurrence_ms,
        MAX_LATE_MS,
        MEMORY_MS,
        occurrence_ms,
        "",
        revision=revision,
    )


def write_revision(store: ClaimStore, ns: str, number: int, fence_ms: int) -> None:
    """Revision ``number`` of ``ns`` as the ledger stores it, in force from ``fence_ms``."""
    revision = Revision(
        number=number,
        changes=(),
        committed_ms=fence_ms - 2_000,
        fence_ms=fence_ms,
        writer="w",
        host="h",
        note='"fence_ms":1',
        hash="0" * 64,
    )
    store.keep_notes([KeptNote(revisions_kind(ns), str(number), dumps(revision.to_json()))])


def checking(factory: StoreFactory) -> ClaimStore:
    store = factory()
    if factory.backend.name not in CHECKING:
        pytest.skip(f"the {store.name} store leaves rule 6 to the nodes (tested below)")
    assert store.checks_revisions
    return store


def claim(store: ClaimStore, request: ClaimRequest, node: str) -> Outcome:
    return store.claim([request], node=node, lease_ms=LEASE_MS)[0]


def test_a_claim_at_or_past_a_newer_revisions_fence_is_stale(store_factory: StoreFactory) -> None:
    store = checking(store_factory)
    ns, now = namespace(), store.time_ms()
    write_revision(store, ns, 1, now - 5_000)
    write_revision(store, ns, 2, now)
    at_fence, before_fence = firing(ns, now, 1), firing(ns, now - 1, 1)

    assert store.claim([at_fence, before_fence], node="n1", lease_ms=LEASE_MS) == [
        Outcome.STALE,
        Outcome.WON,
    ]
    # Under the revision in force, the same firing is won.
    assert claim(store, dataclasses.replace(at_fence, revision=2), "n1") is Outcome.WON


def test_a_stale_claim_leaves_the_firing_to_a_node_that_knows_the_revision(
    store_factory: StoreFactory,
) -> None:
    store, other = checking(store_factory), store_factory()
    ns, now = namespace(), store.time_ms()
    write_revision(store, ns, 1, now - 1_000)
    behind = firing(ns, now, 0)

    assert claim(store, behind, "n1") is Outcome.STALE
    held = store_factory.backend.name == "redis-cluster"  # its script won before the read
    current = dataclasses.replace(behind, revision=1)
    assert claim(other, current, "n2") is (Outcome.HELD if held else Outcome.WON)


def test_a_current_claim_or_one_without_a_revision_is_never_stale(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    ns, now = namespace(), store.time_ms()
    if store.keeps_notes:
        write_revision(store, ns, 1, now - 1_000)
    requests = [firing(ns, now, 1), firing(ns, now, None), firing(namespace(), now, 0)]

    assert store.claim(requests, node="n1", lease_ms=LEASE_MS) == [Outcome.WON] * 3


def test_nats_and_rabbitmq_never_answer_stale(store_factory: StoreFactory) -> None:
    store = store_factory()
    if store_factory.backend.name in CHECKING:
        pytest.skip("this store checks revisions (tested above)")
    ns, now = namespace(), store.time_ms()
    if store.keeps_notes:
        write_revision(store, ns, 1, now - 1_000)

    assert not store.checks_revisions
    assert claim(store, firing(ns, now, 0), "n1") is Outcome.WON


def test_the_holders_renewal_is_stale_and_another_nodes_live_claim_decides_first(
    store_factory: StoreFactory,
) -> None:
    store, other = checking(store_factory), store_factory()
    ns, now = namespace(), store.time_ms()
    mine, theirs = firing(ns, now + 1_000, 0), firing(ns, now + 1_000, 0)
    assert store.claim([mine, theirs], node="n1", lease_ms=LEASE_MS) == [Outcome.WON] * 2
    store.commit([theirs.id], node="n1")
    write_revision(store, ns, 1, now)

    assert claim(store, mine, "n1") is Outcome.STALE
    assert claim(other, mine, "n2") is Outcome.HELD  # the pending claim stands
    assert claim(other, theirs, "n2") is Outcome.LOST
    assert claim(store, dataclasses.replace(mine, revision=1), "n1") is Outcome.WON


def test_late_comes_before_stale_and_an_unreadable_fence_is_stale(
    store_factory: StoreFactory,
) -> None:
    store = checking(store_factory)
    ns, now = namespace(), store.time_ms()
    store.keep_notes([KeptNote(revisions_kind(ns), "1", '{"v":1,"number":1}')])
    late = firing(ns, now - MAX_LATE_MS - 20_000, 0)

    assert claim(store, late, "n1") is Outcome.LATE
    assert claim(store, firing(ns, now, 0), "n1") is Outcome.STALE


def test_each_claim_of_a_mixed_batch_is_judged_by_its_own_namespace_and_revision(
    store_factory: StoreFactory,
) -> None:
    store = checking(store_factory)
    one, two, now = namespace(), namespace(), store.time_ms()
    write_revision(store, one, 1, now - 1_000)
    write_revision(store, two, 1, now - 1_000)
    write_revision(store, two, 2, now + 5_000)
    batch = [firing(one, now, 0), firing(two, now, 1), firing(two, now, 0), firing(one, now, 1)]

    outcomes = store.claim(batch, node="n1", lease_ms=LEASE_MS)

    assert outcomes == [Outcome.STALE, Outcome.WON, Outcome.STALE, Outcome.WON]


def test_an_atomic_claim_that_is_stale_runs_none_of_its_commands(
    store_factory: StoreFactory,
) -> None:
    if store_factory.backend.name != "redis":
        pytest.skip("claim and enqueue in one script is the Redis store's")
    store = store_factory()
    ns, now = namespace(), store.time_ms()
    write_revision(store, ns, 1, now - 1_000)
    queue = f"{ns}:queue"
    stale, current = firing(ns, now, 0), firing(ns, now, 1)
    push = [["RPUSH", queue, "stale"]], [["RPUSH", queue, "current"]]

    outcomes = store.claim_and_push([stale, current], list(push), node="n1")  # type: ignore[attr-defined]

    assert outcomes == [Outcome.STALE, Outcome.WON]
    client = store._client  # type: ignore[attr-defined]
    assert [as_text(v) for v in client.lrange(queue, 0, -1)] == ["current"]
    client.delete(queue)


def as_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
