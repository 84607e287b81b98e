"""Real node processes (``tests/node_process.py``) racing on one claim store: started,
killed with SIGKILL, reaped by pid, and judged.

Each node runs ``Every(1)`` and ``Every(2)`` (lease 30 s, max_late 60 s) and writes each
firing it wins as one JSON line, flushed at once, so that a killed node's firings count.
A *squatter* claims three coming firings pending, as a node that dies between its claim
and its send would, and is killed before it sends or commits: the others must take
those over when the lease runs out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

NODE = Path(__file__).with_name("node_process.py")
ROOT = Path(__file__).resolve().parent.parent
SQUATTER = """
import sys, time
sys.path.insert(0, sys.argv[3])
from node_process import SCHEDULE
from beatless.schedule.firing import Firing, claim_request
from beatless.stores import Outcome, open_store

url, first_s = sys.argv[1], int(sys.argv[2])
entry = SCHEDULE.entry("every-1s")
address = SCHEDULE.address(entry)
firings = [Firing.of(entry, None, address, s * 1000) for s in range(first_s, first_s + 3)]
store = open_store(url, namespace=SCHEDULE.namespace)
outcomes = store.claim([claim_request(f) for f in firings], node="squatter", lease_ms=30_000)
assert outcomes == [Outcome.WON] * 3, outcomes
print(" ".join(f.id for f in firings), flush=True)
time.sleep(600)
"""


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def start_nodes(
    url: str, out_dir: Path, count: int, seconds: float
) -> list[subprocess.Popen[bytes]]:
    """``count`` nodes ``n0``, ``n1``, … on the store at ``url``, for ``seconds`` each."""

    def command(i: int) -> list[str]:
        out = str(out_dir / f"node{i}.jsonl")
        return [sys.executable, str(NODE), url, out, str(seconds), f"n{i}"]

    return [subprocess.Popen(command(i), env=environment()) for i in range(count)]


def reap(processes: list[Any], timeout: float) -> None:
    """Wait for each process until ``timeout`` in all; kill what is left by pid."""
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def last_start(out_dir: Path, launched: float) -> float:
    """When the last node of ``out_dir`` had its scheduler running (each writes the
    instant beside its firings), or ``launched`` if none wrote one yet."""
    starts = [float(p.read_text() or launched) for p in out_dir.glob("node*.jsonl.started")]
    return max([launched, *starts])


def read_firings(out_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(out_dir.glob("node*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def squat(url: str, first_s: int) -> tuple[subprocess.Popen[str], list[str]]:
    """A process that claims three firings of ``every-1s`` from ``first_s`` pending
    (lease 30 s), says which, and waits to be killed before it sends or commits."""
    args = [sys.executable, "-c", SQUATTER, url, str(first_s), str(NODE.parent)]
    process = subprocess.Popen(args, env=environment(), stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.kill()
        process.wait()
        pytest.fail("the squatter process claimed nothing")
    return process, line.split()


@dataclass
class Run:
    """What one fleet run did."""

    started: float
    ended: float
    processes: list[subprocess.Popen[bytes]]
    firings: list[dict[str, Any]]
    victim: int
    killed_at: float
    squatted: list[str] = field(default_factory=list)


def wait_for_a_win(path: Path, deadline: float) -> None:
    """Until the node writing ``path`` has won a firing, or ``deadline``: on a loaded
    machine a node can start late and win nothing in its first seconds, and a kill before
    its first win would test nothing."""
    while time.time() < deadline:
        if path.exists() and path.read_text().strip():
            return
        time.sleep(0.2)


def kill_one_of_three(
    url: str, out_dir: Path, *, seconds: float, kill_at_s: float, victim: int = 2, squatter: bool
) -> Run:
    """Three nodes for ``seconds``; node ``victim`` killed with SIGKILL ``kill_at_s``
    after the start (later if it has not won a firing yet, 20 s at most); with
    ``squatter``, a squatter claiming firings due 5 s after the start, killed at once.
    Every process is reaped or killed, pass or fail."""
    started = time.time()
    processes = start_nodes(url, out_dir, 3, seconds)
    squatting: subprocess.Popen[str] | None = None
    squatted: list[str] = []
    try:
        if squatter:
            squatting, squatted = squat(url, int(time.time()) + 5)
            os.kill(squatting.pid, signal.SIGKILL)
        time.sleep(max(0.0, started + kill_at_s - time.time()))
        wait_for_a_win(out_dir / f"node{victim}.jsonl", deadline=time.time() + 20)
        os.kill(processes[victim].pid, signal.SIGKILL)
        killed_at = time.time()
        reap(processes, seconds + 30)
    finally:
        for process in [*processes, *([squatting] if squatting else [])]:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.wait()
    ended = time.time()
    firings = read_firings(out_dir)
    return Run(last_start(out_dir, started), ended, processes, firings, victim, killed_at, squatted)


def assert_every_occurrence_exactly_once(
    firings: list[dict[str, Any]], started: float, ended: float
) -> None:
    """No firing won twice, and every occurrence of both entries won in the window every
    node covered fully: from a little after the last start to a little before the first
    stop."""
    ids = Counter(f["id"] for f in firings)
    assert ids, "no node enqueued anything"
    assert max(ids.values()) == 1, f"duplicates: {[i for i, n in ids.items() if n > 1]}"
    low, high = int(started) + 3, int(ended) - 8
    for name, step in (("every-1s", 1), ("every-2s", 2)):
        seen = {int(f["occurrence_ms"]) // 1000 for f in firings if f["entry"] == name}
        expected = {s for s in range(low, high) if s % step == 0}
        assert expected, "the window is empty: the machine is too slow for this test"
        assert expected <= seen, f"{name} missed {sorted(expected - seen)}"


def assert_the_kill_was_survived(run: Run) -> None:
    """The victim died by SIGKILL having won some firings, all before its death; the
    others ended on their own; the squatter's firings were taken over by a survivor once
    its lease (30 s) ran out."""
    survivors = [p for i, p in enumerate(run.processes) if i != run.victim]
    assert run.processes[run.victim].returncode == -signal.SIGKILL
    assert [p.returncode for p in survivors] == [0, 0]
    assert_every_occurrence_exactly_once(run.firings, run.started, run.ended)
    by_killed = [f for f in run.firings if f["node"] == f"n{run.victim}"]
    assert by_killed, "the killed node won nothing before it was killed"
    assert all(f["at"] <= run.killed_at for f in by_killed)
    if run.squatted:
        taken_over = [f for f in run.firings if f["id"] in run.squatted]
        assert len(taken_over) == 3
        assert all(f["node"] != f"n{run.victim}" for f in taken_over)
        assert all(f["at"] * 1000 - f["occurrence_ms"] >= 25_000 for f in taken_over)
