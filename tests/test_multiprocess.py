"""Real node processes sharing one SQLite file: every occurrence won exactly once."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from fleet import (
    assert_every_occurrence_exactly_once,
    assert_the_kill_was_survived,
    kill_one_of_three,
    last_start,
    read_firings,
    reap,
    start_nodes,
)

pytestmark = pytest.mark.slow


def test_three_processes_on_one_sqlite_file_win_every_occurrence_exactly_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    started = time.time()
    processes = start_nodes(url, tmp_path, count=3, seconds=20)
    try:
        reap(processes, timeout=40)
    finally:
        reap(processes, timeout=0)
    firings = read_firings(tmp_path)
    assert_every_occurrence_exactly_once(firings, last_start(tmp_path, started), time.time())
    assert {f["node"] for f in firings} <= {"n0", "n1", "n2"}


def test_three_processes_on_one_sqlite_file_survive_a_kill(tmp_path: Path) -> None:
    """n2 killed with SIGKILL after 8 s, and a squatter holding three coming firings
    pending, killed too: the survivors take those over once the 30 s lease runs out."""
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    run = kill_one_of_three(url, tmp_path, seconds=45, kill_at_s=8, squatter=True)
    assert_the_kill_was_survived(run)


@pytest.mark.parametrize("policy", ["latest", "all", "none"])
def test_a_fresh_fleet_catches_up_as_its_policy_says(tmp_path: Path, policy: str) -> None:
    """Three node processes start together on an empty store: of the occurrences before
    their start, ``latest`` sends one per address, ``all`` every one within max_late (60
    of the 1 s entry), ``none`` nothing; after the start, every occurrence, once."""
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    started_ms = time.time() * 1_000
    os.environ["BEATLESS_TEST_CATCH_UP"] = policy
    try:
        processes = start_nodes(url, tmp_path, count=3, seconds=6)
    finally:
        del os.environ["BEATLESS_TEST_CATCH_UP"]
    try:
        reap(processes, timeout=30)
    finally:
        reap(processes, timeout=0)
    firings = read_firings(tmp_path)
    ids = Counter(f["id"] for f in firings)
    assert max(ids.values()) == 1, "a duplicate"
    # "Before the start": before the first node could have started (the processes start
    # within a second of started_ms, so the boundary second is left out).
    before = [f for f in firings if int(f["occurrence_ms"]) < started_ms - 1_000]
    per_address = Counter(str(f["entry"]) for f in before)
    if policy == "latest":
        assert set(per_address.values()) <= {1}, per_address
    elif policy == "all":
        # Every occurrence within max_late (60 s) of a node's start: those of the 50 s
        # before started_ms whatever a loaded machine adds to the processes' start.
        old = {int(f["occurrence_ms"]) // 1_000 for f in before if f["entry"] == "every-1s"}
        first = int(started_ms / 1_000) - 50
        assert set(range(first, int(started_ms / 1_000) - 1)) <= old, sorted(old)
        assert per_address["every-2s"] >= 25, per_address
    else:
        assert per_address == Counter(), per_address
    after = {int(f["occurrence_ms"]) // 1_000 for f in firings if f["entry"] == "every-1s"}
    low, high = int(started_ms / 1_000) + 3, int(started_ms / 1_000) + 5
    assert set(range(low, high)) <= after, sorted(after)
