"""Real node processes sharing one SQLite file: every occurrence won exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

NODE = Path(__file__).with_name("node_process.py")
pytestmark = pytest.mark.slow


def start_nodes(
    url: str, tmp_path: Path, count: int, seconds: float
) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(NODE),
                url,
                str(tmp_path / f"node{i}.jsonl"),
                str(seconds),
                f"n{i}",
            ],
            env=env,
        )
        for i in range(count)
    ]


def reap(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def read_firings(tmp_path: Path) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for path in sorted(tmp_path.glob("node*.jsonl"))
        for line in path.read_text().splitlines()
    ]


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
    ended = time.time()
    firings = read_firings(tmp_path)
    ids = Counter(f["id"] for f in firings)
    assert ids, "no node enqueued anything"
    assert max(ids.values()) == 1, f"duplicates: {[i for i, n in ids.items() if n > 1]}"
    # Judge the window every node covered fully: from a little after the last start
    # to a little before the first stop.
    low, high = int(started) + 3, int(ended) - 8
    for name, step in (("every-1s", 1), ("every-2s", 2)):
        seen = {int(f["occurrence_ms"]) // 1000 for f in firings if f["entry"] == name}
        expected = {s for s in range(low, high) if s % step == 0}
        assert expected, "the window is empty: the machine is too slow for this test"
        assert expected <= seen, f"{name} missed {sorted(expected - seen)}"
    assert {f["node"] for f in firings} <= {"n0", "n1", "n2"}


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
        assert per_address["every-1s"] >= 58, per_address
        assert per_address["every-2s"] >= 29, per_address
    else:
        assert per_address == Counter(), per_address
    after = {int(f["occurrence_ms"]) // 1_000 for f in firings if f["entry"] == "every-1s"}
    low, high = int(started_ms / 1_000) + 3, int(started_ms / 1_000) + 5
    assert set(range(low, high)) <= after, sorted(after)
