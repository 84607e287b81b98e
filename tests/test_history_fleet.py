"""The history against what was sent, firing by firing, on a fleet of real nodes.

Three ``beatless run`` processes share one SQLite store (a file of the test's own). Two
entries: ``tick`` (every second, max_late 3 s: every node claims each firing) and
``ladder`` (every 2 s, max_late 60 s: each firing is left to its preferred node, and the
others look again at their rungs). Both are paused, resumed, paused again while one node
is killed with SIGKILL, and resumed; then the nodes are stopped. Each node logs every
firing it sends (``enqueue {id}``); the test compares those lines with the history that
``beatless status`` reads: every firing sent once, every firing sent shown ``won`` (or
``takeover``), and none that was not sent shown sent.

Nodes that read a pause (or a resume) at different instants disagree on the firings in
between: one sends, another notes ``paused``. The history must tell the one that ran.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fleet import environment

from beatless.schedule.firing import firing_id

pytestmark = pytest.mark.slow

NAMESPACE = "history-fleet"
SCHEDULE = f"""
namespace = "{NAMESPACE}"

[[entry]]
name = "tick"
task = "tests.tick"
every = "1s"
max_late = "3s"

[[entry]]
name = "ladder"
task = "tests.ladder"
every = "2s"
max_late = "60s"
"""
SENT = re.compile(r"enqueue (\S+) entry='(\w+)'")
PERIOD_MS = {"tick": 1_000, "ladder": 2_000}


def beatless(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beatless", *args],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def status(plan: Path, url: str) -> dict[str, Any]:
    done = beatless("status", str(plan), "--store", url, "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def control(plan: Path, url: str, action: str) -> None:
    for entry in PERIOD_MS:
        done = beatless(action, entry, "--schedule", str(plan), "--store", url)
        assert done.returncode == 0, done.stderr


def start(plan: Path, url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "beatless", "run", str(plan), "--store", url]
    with log.open("ab") as out:
        return subprocess.Popen(
            [*command, "--node", name], env=environment(), stdout=out, stderr=out
        )


def wait_for_three_nodes(plan: Path, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = status(plan, url)
        if len(report["nodes"]) == 3 and all(e["last"] for e in report["entries"]):
            return
        time.sleep(0.5)
    pytest.fail(f"three nodes never ran both entries within {timeout:g}s")


def sends(logs: list[Path]) -> dict[str, list[str]]:
    """Per firing id, the nodes that sent it (by their logs)."""
    sent: dict[str, list[str]] = {}
    for log in logs:
        for match in SENT.finditer(log.read_text(errors="replace")):
            sent.setdefault(match.group(1), []).append(log.stem)
    return sent


def test_every_firing_that_ran_is_won_in_the_history_through_pauses_and_a_kill(
    tmp_path: Path,
) -> None:
    plan = tmp_path / "schedule.toml"
    plan.write_text(SCHEDULE)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    logs = [tmp_path / f"n{i}.log" for i in range(3)]
    nodes = [start(plan, url, f"n{i}", log) for i, log in enumerate(logs)]
    try:
        wait_for_three_nodes(plan, url, 40)
        began_ms = int(time.time() * 1_000)
        for _ in range(2):  # paused and resumed while every node runs
            time.sleep(3)
            control(plan, url, "pause")
            time.sleep(4)
            control(plan, url, "resume")
        time.sleep(3)
        control(plan, url, "pause")
        time.sleep(1.5)
        os.kill(nodes[2].pid, signal.SIGKILL)  # n2 dies while the entries are paused
        nodes[2].wait(10)
        time.sleep(2)
        control(plan, url, "resume")
        time.sleep(8)  # the survivors send n2's share of ladder at their rungs
        ended_ms = int(time.time() * 1_000)
        for node in nodes[:2]:
            node.send_signal(signal.SIGTERM)  # a last sync posts what is left
        for node in nodes[:2]:
            node.wait(30)
        report = status(plan, url)
    finally:
        for node in nodes:
            if node.poll() is None:
                os.kill(node.pid, signal.SIGKILL)
            node.wait(10)

    sent = sends(logs)
    twice = {id_: who for id_, who in sent.items() if len(who) > 1}
    assert not twice, twice
    for entry in report["entries"]:
        name, period = entry["entry"], PERIOD_MS[entry["entry"]]
        told = {i["id"]: i for i in entry["timeline"]}
        assert len(told) == len(entry["timeline"])  # each firing once
        oldest = min(i["occurrence_ms"] for i in entry["timeline"])
        first = max(began_ms, oldest) // period * period + period
        # The last firings: every node stopped before their rungs (ladder: 9 s).
        last = ended_ms - (10_000 if name == "ladder" else 1_000)
        judged = range(first, last, period)
        ran = [o for o in judged if firing_id(f"{NAMESPACE}/{name}", o) in sent]
        paused = [o for o in judged if o not in ran]
        assert ran, name
        assert paused, (name, ran)
        for occurrence in judged:
            id_ = firing_id(f"{NAMESPACE}/{name}", occurrence)
            outcome = told[id_]["outcome"] if id_ in told else None
            if id_ in sent:
                assert outcome in ("won", "takeover"), (name, occurrence, told.get(id_))
            else:
                assert outcome == "paused", (name, occurrence, told.get(id_))
        assert entry["missed"] == 0, entry
