"""The fan-out scale bench runs its quick mode end to end on Redis: three node processes,
every firing of the occurrence won exactly once, none late, and its keys removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from service_check import require_service

BENCH = Path(__file__).resolve().parent.parent / "bench" / "scale_fanout.py"
STORE = "redis://127.0.0.1:6379/15"


@pytest.mark.slow  # a benchmark: 20,000 firings by three processes, 45 s
@pytest.mark.serial  # asserts the lateness of every firing
def test_quick_fan_out_is_won_once_each_on_time_by_three_nodes_and_cleaned_up() -> None:
    redis = pytest.importorskip("redis")
    require_service("Redis", "127.0.0.1", 6379)

    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--store", STORE, "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )

    assert done.returncode == 0, done.stdout[-2_000:] + done.stderr[-2_000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    fleet = result["fleet"]
    assert result["parameters"]["tenants"] == 20_000
    assert fleet["expected"] == fleet["won_once"] == 20_000
    assert (fleet["duplicates"], fleet["misses"], fleet["strays"], fleet["late"]) == (0, 0, 0, 0)
    assert fleet["max_lateness_ms"] < 30_000
    nodes = result["nodes"]
    assert len(nodes) == 3
    assert sum(n["enqueued"] for n in nodes) == 20_000
    assert all(n["peak_rss_mb"] >= n["rss_before_occurrence_mb"] > 0 for n in nodes)
    assert 8 <= result["memory"]["bytes_per_pending_firing"] < 9
    assert fleet["keys_removed"] > 20_000
    client = redis.Redis.from_url(STORE)
    try:
        namespace = result["parameters"]["namespace"]
        assert list(client.scan_iter(match=f"beatless:{namespace}:*", count=1_000)) == []
    finally:
        client.close()
