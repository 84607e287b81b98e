"""The worker's side of a firing (``beatless.node.runs``), over every claim store.

Each worker is a :class:`~beatless.node.runs.Runs` of its own, opening its own client of the
test's store through ``store_factory`` (see ``tests/stores.py``), as a worker process
would. Where the test controls the store's clock, the runs read the same clock, so the
records they claim "now" are now for the store too.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from service_check import require_service
from stores import BACKENDS, REDIS, Backend, ManualClock, Opener, StoreFactory, free_port

from beatless.core.triggers import Every
from beatless.errors import StoreUnavailable
from beatless.node.runs import RunPolicy, Runs
from beatless.schedule.entry import Entry
from beatless.schedule.firing import Firing, claim_request, executed_id, firing_id, run_lease_id
from beatless.schedule.options import OVERLAP
from beatless.stores import ClaimRequest, ClaimStore, MemoryStore, Outcome
from beatless.stores.base import Note
from beatless.stores.sqlite import SQLiteStore

LEASE_MS = 600
"""A run lease short enough for a store with a server clock to see it lapse by sleeping."""
LONG_LEASE_MS = 60_000
NO_HEARTBEAT_MS = 3_600_000
"""A heartbeat that never comes within a test: the worker stopped renewing."""
MEMORY_MS = 80_000
NO_WAIT = timedelta(0)
"""A ``check_wait`` that gives a check up at its first failure."""

Workers = Callable[[str], Runs]


def policy(
    *,
    overlap: str = "allow",
    once_only: bool = True,
    lease_ms: int = LONG_LEASE_MS,
    heartbeat_ms: int = NO_HEARTBEAT_MS,
) -> RunPolicy:
    return RunPolicy(overlap, lease_ms, heartbeat_ms, once_only, MEMORY_MS)


def new_address() -> str:
    return f"runs/{uuid.uuid4().hex[:8]}"


def firings(address: str, count: int) -> list[str]:
    """The ids of ``count`` firings of ``address``, a minute apart."""
    return [firing_id(address, 1_800_000_000_000 + i * 60_000) for i in range(count)]


def _workers(factory: StoreFactory) -> Iterator[Workers]:
    clock = factory.clock if factory.exact_clock else time.time
    made: list[Runs] = []

    def worker(node: str) -> Runs:
        runs = Runs(factory, node, clock=clock)
        made.append(runs)
        return runs

    yield worker
    for runs in made:
        runs.close()


@pytest.fixture
def workers(store_factory: StoreFactory) -> Iterator[Workers]:
    """Makes workers (``Runs``) whose stores are clients of the test's one store."""
    yield from _workers(store_factory)


# -- once-only --------------------------------------------------------------------------------


def test_the_first_run_of_a_firing_proceeds_and_holds_its_records(workers: Workers) -> None:
    worker = workers("w1")
    address = new_address()
    (id_,) = firings(address, 1)

    run = worker.start(id_, address, policy(overlap="skip"))

    assert (run.verdict, run.proceed) == ("run", True)
    assert run.held == (executed_id(id_), run_lease_id(address))
    assert worker.active() == 1
    worker.end(run)
    worker.end(run)
    assert worker.active() == 0
    assert worker.counts == {"run": 1}


def test_a_second_copy_of_a_firing_is_a_duplicate_while_the_first_runs_and_after_it_ended(
    workers: Workers,
) -> None:
    a, b = workers("a"), workers("b")
    address = new_address()
    (id_,) = firings(address, 1)
    renewed = policy(lease_ms=1_500, heartbeat_ms=400)
    first = a.start(id_, address, renewed)
    assert first.verdict == "run"

    # The copy waits a run_lease and a heartbeat for the first run to end or lapse; it
    # keeps being renewed, so it is a live run and the copy a duplicate.
    began = time.monotonic()
    while_running = b.start(id_, address, renewed)
    assert (while_running.verdict, while_running.proceed) == ("duplicate", False)
    assert time.monotonic() - began >= 1.5
    a.end(first)

    assert b.start(id_, address, policy()).verdict == "duplicate"
    assert a.start(id_, address, policy()).verdict == "duplicate"
    # A framework retry is the next attempt: a record of its own.
    retry = b.start(id_, address, policy(), attempt=1)
    assert retry.verdict == "run"
    b.end(retry)
    assert b.counts == {"duplicate": 2, "run": 1}


def test_without_once_only_or_skip_a_run_checks_nothing_and_proceeds(workers: Workers) -> None:
    a, b = workers("a"), workers("b")
    address = new_address()
    (id_,) = firings(address, 1)
    unguarded = policy(once_only=False)

    first, second = a.start(id_, address, unguarded), b.start(id_, address, unguarded)

    assert (first.verdict, second.verdict) == ("run", "run")
    assert first.held == second.held == ()


# -- overlap "skip" ------------------------------------------------------------------------------


def test_with_skip_another_firing_of_the_address_is_skipped_while_one_runs_and_runs_after(
    workers: Workers,
) -> None:
    a, b = workers("a"), workers("b")
    address = new_address()
    one, two, three, four = firings(address, 4)
    skip = policy(overlap="skip")
    first = a.start(one, address, skip)
    assert first.verdict == "run"

    skipped = b.start(two, address, skip)
    assert (skipped.verdict, skipped.proceed, skipped.held) == ("skipped_overlap", False, ())
    assert a.start(four, address, skip).verdict == "skipped_overlap"
    a.end(first)

    after = b.start(three, address, skip)
    assert after.verdict == "run"
    # The skipped firing is handled: its once-only record was committed when skipped.
    assert a.start(two, address, skip).verdict == "duplicate"
    b.end(after)
    assert b.counts == {"skipped_overlap": 1, "run": 1}


def test_with_skip_and_no_once_only_the_skipped_firing_itself_runs_once_the_run_ended(
    workers: Workers,
) -> None:
    a, b = workers("a"), workers("b")
    address = new_address()
    one, two = firings(address, 2)
    skip = policy(overlap="skip", once_only=False)
    first = a.start(one, address, skip)
    assert first.held == (run_lease_id(address),)

    assert b.start(two, address, skip).verdict == "skipped_overlap"
    a.end(first)

    again = b.start(two, address, skip)
    assert again.verdict == "run"
    b.end(again)


def test_with_skip_runs_of_other_addresses_do_not_overlap(workers: Workers) -> None:
    a, b = workers("a"), workers("b")
    here, there = new_address(), new_address()
    skip = policy(overlap="skip")

    first = a.start(firings(here, 1)[0], here, skip)
    other = b.start(firings(there, 1)[0], there, skip)

    assert (first.verdict, other.verdict) == ("run", "run")


def test_the_scheduler_s_claim_of_a_firing_whose_address_a_worker_runs_is_overlap(
    workers: Workers, store_factory: StoreFactory
) -> None:
    a, b = workers("a"), workers("b")
    entry = Entry(
        name="report",
        task="tasks.report",
        trigger=Every(60),
        overlap="skip",
        run_lease="1m",
        heartbeat="10s",
    )
    address, now = new_address(), store_factory.now_ms()
    current, nxt, after = (Firing.of(entry, None, address, now + i) for i in range(3))
    scheduler = store_factory()
    run = a.start(current.id, address, RunPolicy.of_entry(entry))
    assert run.verdict == "run"

    (claimed,) = scheduler.claim([claim_request(nxt)], node="scheduler", lease_ms=LEASE_MS)
    if scheduler.checks_overlap:
        assert claimed is Outcome.OVERLAP
    else:
        # Enqueued all the same; the worker's own check refuses the run.
        assert claimed is Outcome.WON
        assert b.start(nxt.id, address, RunPolicy.of_entry(entry)).verdict == "skipped_overlap"
    a.end(run)

    (claimed,) = scheduler.claim([claim_request(after)], node="scheduler", lease_ms=LEASE_MS)
    assert claimed is Outcome.WON


# -- a worker that stopped renewing ----------------------------------------------------------


def test_a_run_whose_worker_stopped_renewing_lets_the_next_firing_of_its_address_run(
    workers: Workers, store_factory: StoreFactory
) -> None:
    a, b = workers("a"), workers("b")
    address = new_address()
    one, two, three = firings(address, 3)
    short = policy(overlap="skip", lease_ms=LEASE_MS)
    stuck = a.start(one, address, short)
    assert stuck.verdict == "run"
    assert b.start(two, address, short).verdict == "skipped_overlap"

    store_factory.advance(LEASE_MS + 200)

    nxt = b.start(three, address, short)
    assert nxt.verdict == "run"
    assert b.start(firings(address, 4)[3], address, short).verdict == "skipped_overlap"
    b.end(nxt)
    a.end(stuck)


def test_a_second_copy_of_a_firing_whose_worker_stopped_renewing_runs_as_a_rerun(
    workers: Workers, store_factory: StoreFactory
) -> None:
    """A copy that finds the once-only record held waits, for a run_lease and a
    heartbeat, for it to end or lapse: the record of a worker that stopped renewing lapses,
    and the copy runs as a rerun; the record of a live run is renewed, and a copy then is
    a duplicate."""
    a, b, c = workers("a"), workers("b"), workers("c")
    address = new_address()
    (id_,) = firings(address, 1)
    short = policy(overlap="skip", lease_ms=LEASE_MS)
    renewed = policy(overlap="skip", lease_ms=1_500, heartbeat_ms=400)
    stuck = a.start(id_, address, short)
    if store_factory.exact_clock:
        # The store's clock stands still while the copy waits: the record never lapses.
        assert b.start(id_, address, short).verdict == "duplicate"
        store_factory.advance(LEASE_MS + 200)

    rerun = b.start(id_, address, renewed)
    assert (rerun.verdict, rerun.proceed) == ("rerun", True)
    began = time.monotonic()
    assert c.start(id_, address, renewed).verdict == "duplicate"
    assert time.monotonic() - began >= 1.5  # it waited, and the record stayed renewed
    b.end(rerun)
    # The stuck run ends late: its records are another's now, and stay so.
    a.end(stuck)
    assert c.start(id_, address, renewed).verdict == "duplicate"
    duplicates = 1 if store_factory.exact_clock else 0
    assert b.counts == {"duplicate": duplicates, "rerun": 1} if duplicates else {"rerun": 1}


# -- the heartbeat, in real time ------------------------------------------------------------


def _real_time_memory(_tmp: Path, _clock: ManualClock) -> Opener:
    store = MemoryStore()
    return lambda: store


REAL_TIME = [
    # A memory store on the real clock: time passes for it as for a server's.
    Backend("memory", _real_time_memory, server_clock=True),
    next(b for b in BACKENDS if b.name == "redis"),
]


@pytest.fixture(params=[pytest.param(b, id=b.name) for b in REAL_TIME])
def real_time_workers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workers]:
    backend: Backend = request.param
    if backend.service is not None:
        require_service(*backend.service)
    clock = ManualClock()
    factory = StoreFactory(backend, backend.prepare(tmp_path, clock), clock)
    yield from _workers(factory)
    factory.close()


def test_the_heartbeat_keeps_a_long_run_s_records_past_several_leases(
    real_time_workers: Workers,
) -> None:
    a, b = real_time_workers("a"), real_time_workers("b")
    address = new_address()
    ids = firings(address, 6)
    beating = policy(overlap="skip", lease_ms=1_500, heartbeat_ms=400)
    run = a.start(ids[0], address, beating)
    assert run.verdict == "run"

    for index in range(1, 5):  # 4 s: more than two and a half leases
        time.sleep(1.0)
        assert b.start(ids[index], address, beating).verdict == "skipped_overlap"
        assert b.start(ids[0], address, beating).verdict == "duplicate"

    assert not run.lost
    assert "lease_lost" not in a.counts
    a.end(run)
    assert b.start(ids[5], address, beating).verdict == "run"


# -- a store that cannot be reached ----------------------------------------------------------


class Unreachable(ClaimStore):
    """A store whose every call fails as an unreachable server's does."""

    name = "unreachable"

    def _fail(self) -> StoreUnavailable:
        return StoreUnavailable("unreachable store: connection refused")

    def time_ms(self) -> int:
        raise self._fail()

    def probe(self) -> None:
        raise self._fail()

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        raise self._fail()

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        raise self._fail()

    def release(self, ids: Sequence[str], *, node: str) -> None:
        raise self._fail()

    def post(self, notes: Sequence[Note]) -> None:
        raise self._fail()

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        raise self._fail()


def _closed_redis() -> ClaimStore:
    pytest.importorskip("redis", reason="the redis store needs redis-py")
    from beatless.stores.redis.store import RedisStore

    return RedisStore(f"redis://{REDIS[1]}:{free_port()}/0", socket_timeout=1)


def _cannot_open() -> ClaimStore:
    raise StoreUnavailable("the store cannot be opened: connection refused")


@pytest.mark.parametrize(
    "open_store",
    [Unreachable, _closed_redis, _cannot_open],
    ids=["claims-fail", "redis-at-a-closed-port", "opening-fails"],
)
@pytest.mark.parametrize(
    ("guard", "verdict"),
    [
        (policy(), "unchecked"),
        (policy(overlap="skip", once_only=False), "skipped_overlap"),
        (policy(overlap="skip"), "skipped_overlap"),
    ],
    ids=["once-only", "skip", "both"],
)
def test_when_the_store_cannot_be_reached_once_only_is_given_up_and_skip_is_not(
    open_store: Callable[[], ClaimStore], guard: RunPolicy, verdict: str
) -> None:
    runs = Runs(open_store, "w", check_wait=NO_WAIT)
    address = new_address()
    (id_,) = firings(address, 1)

    run = runs.start(id_, address, guard)

    assert run.verdict == verdict
    assert run.proceed is (verdict == "unchecked")
    assert run.held == ()
    runs.end(run)
    assert runs.counts == {verdict: 1}
    runs.close()


def test_a_store_that_cannot_be_opened_at_a_run_s_start_counts_as_unreachable(
    tmp_path: Path,
) -> None:
    # An SQLite store opens its file in its constructor: a file whose write lock another
    # process holds longer than busy_timeout cannot be opened (StoreUnavailable).
    path = tmp_path / "claims.db"
    SQLiteStore(path).close()
    runs = Runs(lambda: SQLiteStore(path, busy_timeout=0.1), "w", check_wait=NO_WAIT)
    address = new_address()
    one, two = firings(address, 2)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")

    assert runs.start(one, address, policy()).verdict == "unchecked"
    assert runs.start(one, address, policy(overlap="skip")).verdict == "skipped_overlap"

    locker.execute("ROLLBACK")
    locker.close()
    run = runs.start(two, address, policy())
    assert run.verdict == "run"
    runs.end(run)
    runs.close()


# -- the policy header ----------------------------------------------------------------------

policies = st.builds(
    RunPolicy,
    overlap=st.sampled_from(OVERLAP),
    lease_ms=st.integers(min_value=0, max_value=2**63),
    heartbeat_ms=st.integers(min_value=0, max_value=2**63),
    once_only=st.booleans(),
    memory_ms=st.integers(min_value=0, max_value=2**63),
)


@given(policies)
def test_a_policy_survives_its_header(run_policy: RunPolicy) -> None:
    text = run_policy.encode()

    assert isinstance(text, str)
    assert RunPolicy.decode(text) == run_policy


headers = st.one_of(
    st.text(),
    st.text(alphabet="v1|0123456789-_ skipalow", max_size=40),
    st.lists(st.text(max_size=12), min_size=6, max_size=6).map(lambda p: "|".join(["v1", *p[1:]])),
    policies.map(lambda p: p.encode()[: len(p.encode()) // 2]),
    st.none(),
    st.integers(),
    st.binary(),
)


@given(headers)
def test_decoding_any_header_gives_a_policy_or_none_and_never_raises(header: object) -> None:
    decoded = RunPolicy.decode(header)

    assert decoded is None or isinstance(decoded, RunPolicy)
    if decoded is not None:
        assert isinstance(header, str)
        assert header.startswith("v1|")
