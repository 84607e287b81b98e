"""A run's check waits for a claim store it cannot reach, up to ``check_wait``.

The case it closes: a store restarted (or a link cut) while a fan-out is sent on the
two-phase path. A node whose commit could not reach the store before its lease ran out
leaves the firing to another node, which sends a second copy once the store answers.
Had the worker that got the first copy during the outage run it ``unchecked``, a second
copy checked by another worker before the first one's record was written ran too. A check
that waits for the store instead is answered like any other: of two copies, one runs.

Each worker is a :class:`~beatless.node.runs.Runs` over a :class:`Link` of its own to one
shared memory store: a link that is cut fails every call as an unreachable server does.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import pytest
from waiting import wait_for

from beatless.errors import StoreError, StoreUnavailable
from beatless.node.runs import CHECK_EVERY_S, DEFAULT_CHECK_WAIT, Run, RunPolicy, Runs
from beatless.schedule.firing import firing_id
from beatless.stores import ClaimRequest, ClaimStore, MemoryStore, Outcome
from beatless.stores.base import Note

LONG_LEASE_MS = 60_000
HEARTBEAT_MS = 5_000
MEMORY_MS = 80_000
ONCE_ONLY = RunPolicy("allow", LONG_LEASE_MS, HEARTBEAT_MS, True, MEMORY_MS)
SKIP = RunPolicy("skip", LONG_LEASE_MS, HEARTBEAT_MS, False, MEMORY_MS)
WAIT = timedelta(seconds=20)
"""Longer than any outage below: a check that gives up within it is the bug."""
OUTAGE_S = 1.0


class Link(ClaimStore):
    """A worker's link to a shared memory store; while :attr:`cut` is set, every call
    fails with ``error`` (an outage unless told otherwise). Counts its claims."""

    name = "link"

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.cut = threading.Event()
        self.error: StoreError = StoreUnavailable("link cut: connection refused")
        self.claims = 0

    def _through(self) -> MemoryStore:
        if self.cut.is_set():
            raise self.error
        return self.store

    def time_ms(self) -> int:
        return self._through().time_ms()

    def probe(self) -> None:
        self._through().probe()

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        self.claims += 1
        return self._through().claim(requests, node=node, lease_ms=lease_ms)

    def commit(self, ids: Sequence[str], *, node: str, notes: Sequence[Note] = ()) -> list[bool]:
        return self._through().commit(ids, node=node, notes=notes)

    def release(self, ids: Sequence[str], *, node: str) -> None:
        self._through().release(ids, node=node)

    def post(self, notes: Sequence[Note]) -> None:
        self._through().post(notes)

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        return self._through().read_notes(kinds)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def made() -> Iterator[list[Runs]]:
    runs: list[Runs] = []
    yield runs
    for one in runs:
        one.close()


def worker(store: MemoryStore, made: list[Runs], wait: timedelta = WAIT) -> tuple[Runs, Link]:
    link = Link(store)
    runs = Runs(lambda: link, f"w{len(made)}", check_wait=wait)
    made.append(runs)
    return runs, link


def new_firing() -> tuple[str, str]:
    address = f"runs/{uuid.uuid4().hex[:8]}"
    return firing_id(address, 1_800_000_000_000), address


def started(runs: Runs, id_: str, address: str, policy: RunPolicy = ONCE_ONLY) -> Future[Run]:
    """Start the check in a thread of its own: it may wait."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(runs.start, id_, address, policy)
    pool.shutdown(wait=False)
    return future


def warm(runs: Runs) -> None:
    """Open the worker's store (as a worker that ran tasks before the outage has)."""
    id_, address = new_firing()
    runs.end(runs.start(id_, address, ONCE_ONLY))


# -- the restart case -------------------------------------------------------------------------


def test_a_copy_checked_during_an_outage_waits_and_is_refused_when_another_copy_ran_meanwhile(
    store: MemoryStore, made: list[Runs]
) -> None:
    """The first copy reaches a worker whose link is down; the second copy, sent once the
    store answers, reaches another worker first and runs. When the first worker's link is
    back, its check finds the other copy's record: exactly one copy ran."""
    first_worker, first_link = worker(store, made)
    second_worker, _ = worker(store, made)
    warm(first_worker)
    id_, address = new_firing()

    first_link.cut.set()
    first = started(first_worker, id_, address)
    time.sleep(OUTAGE_S)
    second = second_worker.start(id_, address, ONCE_ONLY)
    second_worker.end(second)
    first_link.cut.clear()

    verdicts = [first.result(timeout=10).verdict, second.verdict]
    assert [v for v in verdicts if v in ("run", "rerun", "unchecked")] == ["run"], verdicts
    assert verdicts == ["duplicate", "run"]
    assert first_worker.counts == {"run": 1, "waited": 1, "duplicate": 1}
    assert second_worker.counts == {"run": 1}


def test_a_check_that_waited_runs_once_the_store_answers_and_a_later_copy_is_refused(
    store: MemoryStore, made: list[Runs], caplog: pytest.LogCaptureFixture
) -> None:
    runs, link = worker(store, made)
    other, _ = worker(store, made)
    warm(runs)
    id_, address = new_firing()

    with caplog.at_level(logging.INFO, logger="beatless.node.runs"):
        link.cut.set()
        first = started(runs, id_, address)
        time.sleep(OUTAGE_S)
        link.cut.clear()
        run = first.result(timeout=10)

    assert run.verdict == "run"
    assert run.held
    assert runs.active() == 1
    runs.end(run)
    assert other.start(id_, address, ONCE_ONLY).verdict == "duplicate"
    assert runs.counts == {"run": 2, "waited": 1}
    waits = [r for r in caplog.records if "waits for the claim store" in r.getMessage()]
    assert len(waits) == 1
    assert waits[0].levelno == logging.INFO
    assert id_ in waits[0].getMessage()
    assert not [r for r in caplog.records if "without its once-only check" in r.getMessage()]


def test_with_overlap_skip_a_check_that_waited_runs_once_the_store_answers(
    store: MemoryStore, made: list[Runs]
) -> None:
    runs, link = worker(store, made)
    id_, address = new_firing()
    link.cut.set()
    first = started(runs, id_, address, SKIP)
    time.sleep(OUTAGE_S)
    link.cut.clear()

    run = first.result(timeout=10)
    assert run.verdict == "run"
    runs.end(run)
    assert runs.counts == {"run": 1, "waited": 1}


def test_a_store_opened_late_is_waited_for_too(store: MemoryStore, made: list[Runs]) -> None:
    """A worker whose first task comes during the outage cannot even open its store."""
    link = Link(store)
    down = threading.Event()
    down.set()

    def open_store() -> ClaimStore:
        if down.is_set():
            raise StoreUnavailable("cannot connect: connection refused")
        return link

    runs = Runs(open_store, "w", check_wait=WAIT)
    made.append(runs)
    id_, address = new_firing()
    first = started(runs, id_, address)
    time.sleep(OUTAGE_S)
    down.clear()
    assert first.result(timeout=10).verdict == "run"


# -- the bound ----------------------------------------------------------------------------------


def test_past_check_wait_the_run_goes_on_unchecked_with_a_warning_that_says_so(
    store: MemoryStore, made: list[Runs], caplog: pytest.LogCaptureFixture
) -> None:
    runs, link = worker(store, made, wait=timedelta(seconds=1.2))
    warm(runs)
    tried = link.claims
    id_, address = new_firing()
    link.cut.set()

    with caplog.at_level(logging.WARNING, logger="beatless.node.runs"):
        began = time.monotonic()
        run = runs.start(id_, address, ONCE_ONLY)
        took = time.monotonic() - began

    assert run.verdict == "unchecked"
    assert run.proceed
    assert 1.2 - CHECK_EVERY_S <= took < 1.2 + CHECK_EVERY_S
    assert 2 <= link.claims - tried <= 4  # one try every CHECK_EVERY_S
    assert runs.counts == {"run": 1, "waited": 1, "unchecked": 1}
    told = [r for r in caplog.records if "run without its once-only check" in r.getMessage()]
    assert len(told) == 1
    assert re.search(r"link cut: connection refused \(tried for 1\.\d s\)", told[0].getMessage())


def test_past_check_wait_overlap_skip_is_refused(store: MemoryStore, made: list[Runs]) -> None:
    runs, link = worker(store, made, wait=timedelta(seconds=0.6))
    id_, address = new_firing()
    link.cut.set()
    run = runs.start(id_, address, SKIP)
    assert run.verdict == "skipped_overlap"
    assert not run.proceed
    assert runs.counts == {"waited": 1, "skipped_overlap": 1}


def test_a_check_wait_of_zero_gives_the_check_up_at_the_first_failure(
    store: MemoryStore, made: list[Runs]
) -> None:
    runs, link = worker(store, made, wait=timedelta(0))
    warm(runs)
    tried = link.claims
    link.cut.set()
    id_, address = new_firing()
    assert runs.start(id_, address, ONCE_ONLY).verdict == "unchecked"
    assert link.claims - tried == 1
    assert runs.counts == {"run": 1, "unchecked": 1}


def test_a_store_error_that_is_not_an_outage_is_not_waited_for(
    store: MemoryStore, made: list[Runs]
) -> None:
    runs, link = worker(store, made)
    warm(runs)
    link.error = StoreError("the store refused the credentials")
    link.cut.set()
    id_, address = new_firing()
    began = time.monotonic()
    assert runs.start(id_, address, ONCE_ONLY).verdict == "unchecked"
    assert time.monotonic() - began < CHECK_EVERY_S
    assert "waited" not in runs.counts


def test_the_default_check_wait_is_thirty_seconds(store: MemoryStore) -> None:
    assert timedelta(seconds=30) == DEFAULT_CHECK_WAIT
    assert Runs(lambda: Link(store), "w").check_wait == DEFAULT_CHECK_WAIT


# -- a run that ends while the store cannot be reached ------------------------------------------

SHORT = RunPolicy("allow", 1_000, 300, True, MEMORY_MS)
"""A run lease of 1 s: a record left pending lapses within the test."""


def ended_cut_off(runs: Runs, link: Link, policy: RunPolicy) -> tuple[str, str]:
    """A firing whose run was checked and won, and ended once ``link`` was cut."""
    id_, address = new_firing()
    run = runs.start(id_, address, policy)
    assert run.verdict == "run"
    link.cut.set()
    runs.end(run)
    return id_, address


def test_a_run_ended_while_cut_off_commits_its_record_once_the_store_answers(
    store: MemoryStore, made: list[Runs], caplog: pytest.LogCaptureFixture
) -> None:
    """The fault: a fan-out's first copy runs and returns as the store link is cut. Left
    pending, its once-only record lapsed a run lease later, and the second copy (sent by
    the node that took the firing over) took it over and ran (``rerun``): run twice."""
    runs, link = worker(store, made)
    other, _ = worker(store, made)
    warm(runs)
    with caplog.at_level(logging.INFO, logger="beatless.node.runs"):
        id_, address = ended_cut_off(runs, link, SHORT)
        time.sleep(1.5)  # past the run lease
        link.cut.clear()
        assert wait_for(lambda: "committed_late" in runs.counts)

    assert other.start(id_, address, SHORT).verdict == "duplicate"
    assert runs.counts == {"run": 2, "committed_late": 1}
    owed = [r for r in caplog.records if "is not committed yet" in r.getMessage()]
    assert len(owed) == 1
    assert owed[0].levelno == logging.WARNING
    assert id_ in owed[0].getMessage()
    assert "link cut: connection refused" in owed[0].getMessage()


def test_a_second_copy_checked_before_the_late_commit_waits_for_it_and_is_refused(
    store: MemoryStore, made: list[Runs]
) -> None:
    runs, link = worker(store, made)
    other, _ = worker(store, made)
    warm(runs)
    id_, address = ended_cut_off(runs, link, ONCE_ONLY)
    second = started(other, id_, address)
    time.sleep(OUTAGE_S)
    link.cut.clear()

    assert second.result(timeout=10).verdict == "duplicate"
    assert runs.counts == {"run": 2, "committed_late": 1}


def test_a_run_whose_lapsed_record_another_copy_took_is_counted_ran_twice_and_told(
    store: MemoryStore, made: list[Runs], caplog: pytest.LogCaptureFixture
) -> None:
    runs, link = worker(store, made)
    other, _ = worker(store, made)
    warm(runs)
    id_, address = ended_cut_off(runs, link, SHORT)
    time.sleep(1.5)
    rerun = other.start(id_, address, SHORT)
    assert rerun.verdict == "rerun"
    with caplog.at_level(logging.WARNING, logger="beatless.node.runs"):
        link.cut.clear()
        assert wait_for(lambda: "ran_twice" in runs.counts)
    other.end(rerun)

    assert runs.counts == {"run": 2, "ran_twice": 1}
    told = [r for r in caplog.records if "lapsed before it could be committed" in r.getMessage()]
    assert len(told) == 1
    assert id_ in told[0].getMessage()


def test_the_late_commit_is_given_up_once_the_memory_passed(
    store: MemoryStore, made: list[Runs], caplog: pytest.LogCaptureFixture
) -> None:
    runs, link = worker(store, made)
    warm(runs)
    with caplog.at_level(logging.WARNING, logger="beatless.node.runs"):
        ended_cut_off(runs, link, RunPolicy("allow", 1_000, 300, True, 1_000))
        assert wait_for(lambda: "uncommitted" in runs.counts)
    assert runs.counts == {"run": 2, "uncommitted": 1}
    assert [r for r in caplog.records if "a later copy of it would have run" in r.getMessage()]
