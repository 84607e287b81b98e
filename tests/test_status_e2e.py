"""``beatless status`` and the controls against real node processes (``beatless run``) on
the local Redis.

One fleet goes through what an operator must see and do: three nodes live; one killed
with SIGKILL and gone from the registry once its record runs out; a fourth node started
with another jitter (drift: exit 1, the fingerprints named); an entry paused (no node
sends it, each counts it paused) and resumed; one manual firing, sent by one node; then
every node stopped for longer than max_late, and the firings nobody sent reported
missed, each once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import environment
from service_check import require_service
from stores import REDIS

from beatless.cli.loader import load_schedule
from beatless.fleet._controls import audit_kind, controls_kind, run_now_kind
from beatless.fleet._notes import entries_kind, history_kind, missed_kind, nodes_kind

pytestmark = pytest.mark.slow
URL = f"redis://{REDIS[1]}:{REDIS[2]}/0"
SCHEDULE = """
namespace = "{namespace}"

[[entry]]
name = "tick"
task = "tests.tick"
every = "1s"
max_late = "3s"

[[entry]]
name = "slow"
task = "tests.slow"
every = "5s"
jitter = "{jitter}"
"""


@pytest.fixture
def namespace(tmp_path: Path) -> Iterator[str]:
    require_service(*REDIS)
    namespace = f"status-e2e-{uuid.uuid4().hex[:8]}"
    yield namespace
    _delete_notes(namespace)


def _delete_notes(namespace: str) -> None:
    """The notes this test's nodes wrote, and nothing else (claims expire on their own)."""
    import redis

    from beatless.stores.redis.store import RedisStore

    store = RedisStore(URL)
    kinds = [nodes_kind(namespace), entries_kind(namespace)]
    kinds += [history_kind(f"{namespace}/{name}") for name in ("tick", "slow")]
    kinds += [missed_kind(f"{namespace}/{name}") for name in ("tick", "slow")]
    kinds += [controls_kind(namespace), run_now_kind(namespace), audit_kind(namespace)]
    with redis.Redis(host=REDIS[1], port=REDIS[2]) as client:
        for kind in kinds:
            client.delete(*store._notes_keys(kind))
    store.close()


def write_schedule(path: Path, namespace: str, jitter: str = "0s") -> Path:
    path.write_text(SCHEDULE.format(namespace=namespace, jitter=jitter))
    return path


def start_node(schedule: Path, name: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "beatless", "run", str(schedule), "--store", URL]
    with log.open("ab") as out:
        return subprocess.Popen(
            [*command, "--node", name], env=environment(), stdout=out, stderr=out
        )


def status(schedule: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "beatless", "status", str(schedule), "--store", URL, "--json"],
        env=environment(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


def control(schedule: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beatless", *args, "--schedule", str(schedule), "--store", URL],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_for(schedule: Path, what: str, test: Any, timeout: float) -> tuple[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        code, report = status(schedule)
        if test(code, report):
            return code, report
        if time.monotonic() > deadline:
            pytest.fail(f"status never showed {what} within {timeout:g}s: {report}")
        time.sleep(0.5)


def names(report: dict[str, Any]) -> list[str]:
    return [n["node"] for n in report["nodes"]]


def kill(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)


def pause_resume_and_run_now(plan: Path) -> None:
    """Pause tick: within a second no node sends it and every node counts it paused;
    resume it; then one manual firing of slow, sent by exactly one node."""
    assert control(plan, "pause", "tick").returncode == 0
    paused_at = time.time()
    time.sleep(4)
    _, report = status(plan)
    tick = next(e for e in report["entries"] if e["entry"] == "tick")
    assert tick["paused"] is True
    after = [i for i in tick["timeline"] if i["occurrence_ms"] > (paused_at + 1.5) * 1_000]
    assert after, tick
    assert {i["outcome"] for i in after} == {"paused"}, after
    assert tick["missed"] == 0
    assert control(plan, "resume", "tick").returncode == 0
    resumed_at = time.time()
    wait_for(
        plan,
        "tick sent again",
        lambda code, r: any(
            i["outcome"] in ("won", "takeover") and i["occurrence_ms"] > resumed_at * 1_000
            for i in next(e for e in r["entries"] if e["entry"] == "tick")["timeline"]
        ),
        10,
    )
    assert control(plan, "run-now", "slow").returncode == 0
    wait_for(
        plan,
        "the manual firing of slow",
        lambda code, r: any(
            i["manual"] for i in next(e for e in r["entries"] if e["entry"] == "slow")["timeline"]
        ),
        10,
    )
    time.sleep(2)  # every node has read the request by now: still one manual firing
    slow = next(e for e in status(plan)[1]["entries"] if e["entry"] == "slow")
    manual = [i for i in slow["timeline"] if i["manual"]]
    assert len(manual) == 1, manual
    assert manual[0]["outcome"] in ("won", "takeover")
    assert [a["action"] for a in status(plan)[1]["audit"]] == ["pause", "resume", "run-now"]


def test_status_follows_a_fleet_through_a_kill_drift_and_an_outage(
    namespace: str, tmp_path: Path
) -> None:
    plan = write_schedule(tmp_path / "schedule.toml", namespace)
    changed = write_schedule(tmp_path / "changed.toml", namespace, jitter="1s")
    log = tmp_path / "nodes.log"
    nodes = [start_node(plan, f"n{i}", log) for i in range(3)]
    try:
        # Three live nodes, one schedule, every entry firing: healthy, exit 0.
        code, report = wait_for(
            plan,
            "three healthy nodes and a fired entry",
            lambda code, r: (
                names(r) == ["n0", "n1", "n2"] and code == 0 and r["entries"][1]["last"] is not None
            ),
            30,
        )
        fingerprint = load_schedule(str(plan)).fingerprint
        assert {n["fingerprint"] for n in report["nodes"]} == {fingerprint}
        assert all(n["last_wake"] and n["clock_offset_ms"] is not None for n in report["nodes"])
        tick = next(e for e in report["entries"] if e["entry"] == "tick")
        assert tick["last"]["outcome"] in ("won", "takeover")
        assert tick["missed"] == 0

        # kill -9 one node: it leaves the registry when its record runs out (15 s).
        kill([nodes[2]])
        killed_at = time.monotonic()
        wait_for(plan, "two live nodes", lambda code, r: names(r) == ["n0", "n1"], 30)
        assert time.monotonic() - killed_at > 5  # not before its record could run out

        # A node running another version of the schedule: drift, exit 1, both named.
        other = load_schedule(str(changed)).fingerprint
        nodes.append(start_node(changed, "n3", log))
        code, report = wait_for(
            plan,
            "drift",
            lambda code, r: any("schedule fingerprint" in p for p in r["problems"]),
            30,
        )
        assert code == 1
        drift = next(p for p in report["problems"] if "schedule fingerprint" in p)
        assert fingerprint in drift
        assert other in drift
        assert "n3" in drift

        # Pause tick through the store, resume it, and one manual firing of slow.
        pause_resume_and_run_now(plan)

        # Every node stopped for 10 s, far past tick's max_late (3 s); one comes back.
        kill(nodes)
        stopped_at = time.time()
        time.sleep(10)
        nodes = [start_node(plan, "n0", log)]
        back_at = time.time()
        code, report = wait_for(
            plan,
            "missed firings of tick",
            lambda code, r: (
                next(e for e in r["entries"] if e["entry"] == "tick")["missed"] >= 5 and code == 1
            ),
            40,
        )
        tick = next(e for e in report["entries"] if e["entry"] == "tick")
        # The seconds of the outage no node could claim in time: from the stop to max_late
        # before the node came back, give or take the second each end can fall on.
        outage = int(back_at - 3 - stopped_at)
        assert outage - 2 <= tick["missed"] <= outage + 2, (outage, tick)
        assert any(p.startswith("entry tick: ") and "missed" in p for p in report["problems"])
        # Each missed occurrence is counted once, whatever the number of nodes reading it.
        again = next(e for e in status(plan)[1]["entries"] if e["entry"] == "tick")
        assert again["missed"] >= tick["missed"]
    finally:
        kill(nodes)
