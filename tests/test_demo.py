"""``beatless demo``: real node processes on one SQLite file, checked independently."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter

import pytest
from service_check import require_service

from beatless.cli.demo import (
    _LateCommits,
    _Run,
    demo_schedule,
    expected_firings,
    summarize,
)
from beatless.node.dispatch import LATE_COMMIT
from beatless.schedule.firing import firing_id

STORES = {
    "sqlite (the default)": (None, None),
    "redis": ("redis://127.0.0.1:6379/5", ("Redis", "127.0.0.1", 6379)),
    "postgres": ("postgresql://127.0.0.1:5432/test", ("PostgreSQL", "127.0.0.1", 5432)),
    "nats": ("nats://127.0.0.1:4222", ("NATS", "127.0.0.1", 4222)),
    "rabbitmq": ("amqp://guest:guest@127.0.0.1:5672/%2F", ("RabbitMQ", "127.0.0.1", 5672)),
}
"""``--store`` of each run, and the service it needs."""


@pytest.mark.slow
@pytest.mark.serial  # a node starved past its lease sends in the two-phase window
@pytest.mark.parametrize("store", list(STORES))
def test_three_node_demo_wins_every_expected_firing_exactly_once(store: str) -> None:
    url, service = STORES[store]
    if service is not None:
        require_service(*service)
    command = [sys.executable, "-m", "beatless", "demo", "--nodes", "3", "--seconds", "8"]
    command += ["--json", *(["--store", url] if url else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    lines = result.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    firings = [json.loads(line) for line in lines[:-1]]
    ids = Counter(f["id"] for f in firings)
    twice = [f for f in firings if ids[f["id"]] > 1]
    assert result.returncode == 0, (
        f"won twice: {twice}; {lines[-1]}\n" + result.stdout[-1_000:] + result.stderr[-2_000:]
    )
    assert summary["event"] == "summary"
    assert summary["firings"] > 0
    assert summary["duplicates"] == 0
    assert summary["missed"] == 0
    assert summary["expected"] > 0
    assert summary["node_failures"] == {}
    assert summary["firings"] == len(firings)
    assert sum(summary["wins_per_node"].values()) == summary["firings"]
    namespace = summary["namespace"]
    assert namespace == "demo"
    ids = [f["id"] for f in firings]
    assert len(ids) == len(set(ids))
    for firing in firings:
        tenant = f"/{firing['tenant']}" if firing["tenant"] else ""
        address = f"{namespace}/{firing['entry']}{tenant}"
        assert firing["id"] == firing_id(address, firing["occurrence_ms"])


def test_a_node_counts_the_sends_whose_commit_came_after_their_lease() -> None:
    """What explains a duplicate in a demo run: a node starved past its lease sent a firing
    whose claim then ran out, and its commit was refused."""
    counter = _LateCommits()
    dispatch = logging.getLogger("beatless.node.dispatch")
    dispatch.addHandler(counter)
    try:
        dispatch.warning(LATE_COMMIT, "an-id", "tick-1s")
        dispatch.warning("firing %s of entry %s: enqueue failed", "an-id", "tick-1s")
    finally:
        dispatch.removeHandler(counter)
    assert counter.count == 1


def test_demo_says_in_one_line_when_its_store_cannot_be_reached() -> None:
    command = [sys.executable, "-m", "beatless", "demo", "--store", "redis://127.0.0.1:1/0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "cannot probe" in result.stderr


def test_expected_firings_are_those_a_node_ran_for_from_occurrence_to_release() -> None:
    schedule = demo_schedule()
    start = 1_800_000_000_000  # a whole minute, so every trigger has an occurrence here
    end = start + 30_000
    expected = expected_firings(schedule, [(start, end)]).values()
    by_entry: dict[str, list[int]] = {}
    for firing in expected:
        by_entry.setdefault(firing.entry.name, []).append(firing.occurrence_ms)
        assert start <= firing.occurrence_ms
        assert firing.release_ms <= end
    # occurrences from the start, releases by the end: tick-1s 0..30 s; tick-2s 0..30 s
    # even; minutely at 0 s; spread-5s (jitter 2 s) 0..25 s, and 30 s only if released at
    # once; fanout (jitter 4 s) 0, 10 and 20 s, 20 tenants each (30 s: those released at 0)
    assert len(by_entry["tick-1s"]) == 31
    assert len(by_entry["tick-2s"]) == 16
    assert by_entry["minutely"] == [start]
    assert sorted(by_entry["spread-5s"])[:6] == [start + s * 1_000 for s in range(0, 30, 5)]
    assert sorted(set(by_entry["fanout"]))[:3] == [start, start + 10_000, start + 20_000]
    assert len([o for o in by_entry["fanout"] if o < start + 30_000]) == 60


def test_a_firing_is_expected_when_one_node_ran_from_its_occurrence_to_its_release() -> None:
    """Two nodes, one started late, one stopped early: a firing counts when one of them
    saw both its occurrence and its release, and only then."""
    schedule = demo_schedule()
    start = 1_800_000_000_000
    spans = [(start + 3_500, start + 10_000), (start + 5_500, start + 20_000)]
    expected = expected_firings(schedule, spans)
    ticks = sorted(f.occurrence_ms - start for f in expected.values() if f.entry.name == "tick-1s")
    assert ticks == list(range(4_000, 20_001, 1_000))  # 3 s: before either started
    for firing in expected.values():
        assert any(a <= firing.occurrence_ms and firing.release_ms <= b for a, b in spans)
    everything = expected_firings(schedule, [(start, start + 30_000)])
    for id_, firing in everything.items():
        covered = any(a <= firing.occurrence_ms and firing.release_ms <= b for a, b in spans)
        assert (id_ in expected) == covered


def test_the_summary_counts_firings_from_when_the_nodes_started_to_when_they_stopped() -> None:
    """Nodes that were slow to start (a loaded machine) are not blamed for the occurrences
    before them, and a firing released before the stop that no node won is a miss."""
    schedule = demo_schedule()
    start = 1_800_000_000_000
    run = _Run(start, start + 8_000, up_ms=start + 500)
    run.spans = {"node-1": (start + 4_200, start + 8_050), "node-2": (start + 4_900, None)}
    expected = expected_firings(schedule, [(start + 4_200, start + 8_050)])
    run.firings = [
        {
            "id": f.id,
            "node": "node-1",
            "entry": f.entry.name,
            "offset_ms": f.offset_ms,
            "lateness_ms": 3,
        }
        for f in expected.values()
        if f.occurrence_ms != start + 7_000
    ]
    summary = summarize(schedule, run, ["node-1", "node-2"], {})
    assert summary["expected"] == len(expected) > 0
    assert summary["missed_firings"] == ["demo/tick-1s@2027-01-15T08:00:07.000Z"]
    assert summary["missed"] == 1
    assert summary["window"] == ["2027-01-15T08:00:04.200Z", "2027-01-15T08:00:08.050Z"]
    assert (summary["seconds"], summary["startup_s"]) == (7.5, 0.5)
