"""``beatless demo``: real node processes on one SQLite file, checked independently."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter

import pytest
from service_check import require_service

from beatless.cli.demo import MARGIN_MS, WARMUP_MS, _LateCommits, demo_schedule, expected_firings
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


def test_expected_firings_cover_each_address_inside_the_window_only() -> None:
    schedule = demo_schedule()
    start = 1_800_000_000_000  # a whole minute, so every trigger has an occurrence here
    end = start + 30_000
    expected = expected_firings(schedule, start, end).values()
    by_entry: dict[str, list[int]] = {}
    for firing in expected:
        by_entry.setdefault(firing.entry.name, []).append(firing.occurrence_ms)
        last = end - firing.entry.jitter_ms - MARGIN_MS
        assert start + WARMUP_MS <= firing.occurrence_ms <= last
    # window [start + 2 s, end - jitter - 2 s]: tick-1s 2..28 s; tick-2s 2..28 s even;
    # spread-5s (jitter 2s) 5..25 s; minutely: none after the warm-up;
    # fanout (jitter 4s) 10 and 20 s, 20 tenants each
    assert len(by_entry["tick-1s"]) == 27
    assert len(by_entry["tick-2s"]) == 14
    assert len(by_entry["spread-5s"]) == 5
    assert "minutely" not in by_entry
    assert sorted(set(by_entry["fanout"])) == [start + 10_000, start + 20_000]
    assert len(by_entry["fanout"]) == 40
