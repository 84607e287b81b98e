"""The connections of one store object (``beatless.stores._pool``): one per call under way."""

from __future__ import annotations

import os
import threading

import pytest

from beatless.errors import StoreError
from beatless.stores._pool import Pool


class Made:
    """Connections made and closed, by number."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.closed: list[int] = []

    def make(self) -> int:
        self.made.append(len(self.made))
        return self.made[-1]

    def pool(self, limit: int | None = None) -> Pool[int]:
        return Pool(self.make, self.closed.append, name="test store", limit=limit)


def test_calls_at_once_take_connections_of_their_own_and_later_calls_reuse_them() -> None:
    made = Made()
    pool = made.pool()
    with pool.take() as first, pool.take() as second:
        assert first != second
    with pool.take() as again:
        assert again == first  # the last given back
    assert made.made == [0, 1]
    assert pool.count == 2


def test_a_call_past_the_limit_waits_for_a_connection_to_come_back() -> None:
    made = Made()
    pool = made.pool(limit=1)
    got: list[int] = []
    taken = threading.Event()

    def other() -> None:
        with pool.take() as item:
            got.append(item)
        taken.set()

    with pool.take() as mine:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(0.2)
        assert not taken.is_set()
    thread.join(5)

    assert got == [mine]
    assert made.made == [0]


def test_close_closes_idle_connections_at_once_and_one_in_use_when_its_call_ends() -> None:
    made = Made()
    pool = made.pool()
    with pool.take() as busy:
        with pool.take() as idle:
            pass
        pool.close(wait_s=0)  # from inside a call: nothing to wait for but itself
        assert made.closed == [idle]
    assert made.closed == [idle, busy]
    assert pool.count == 0
    with pytest.raises(StoreError, match="test store is closed"), pool.take():
        pass


def test_close_waits_for_the_calls_under_way_in_other_threads() -> None:
    """What follows a close (a test's schema dropped, a server stopped) must not race a
    call still under way on another thread."""
    made = Made()
    pool = made.pool()
    taken, release = threading.Event(), threading.Event()

    def call() -> None:
        with pool.take():
            taken.set()
            release.wait(5)

    thread = threading.Thread(target=call)
    thread.start()
    assert taken.wait(5)
    threading.Timer(0.2, release.set).start()
    pool.close()
    assert release.is_set()  # close returned only once the call had ended
    assert made.closed == [0]
    assert pool.count == 0
    thread.join(5)


def test_a_child_process_forgets_the_parent_s_connections_and_makes_its_own() -> None:
    made = Made()
    pool = made.pool()
    with pool.take():
        pass

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            with pool.take() as item:
                code = 0 if item == 1 else 3
            pool.close()
            code = code or (0 if made.closed == [1] else 4)
        except BaseException:
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.idle == [0]
    pool.close()
    assert made.closed == [0]
