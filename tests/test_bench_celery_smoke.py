"""The Celery-on-Redis benchmark runs end to end with tiny parameters."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from service_check import require_binary

BENCH = Path(__file__).resolve().parent.parent / "bench" / "celery_redis.py"
TINY = ["--entries", "10", "--seconds", "4", "--warmup", "1", "--nodes", "3"]
BURST = ["--burst", "200", "--lead", "6", "--burst-cap", "20"]


@pytest.mark.slow
def test_bench_measures_stock_beat_and_three_beatless_beats_side_by_side() -> None:
    if shutil.which("redis-server") is None:
        require_binary("redis-server is not on PATH: the benchmark starts a private one")
    done = subprocess.run(
        [sys.executable, str(BENCH), *TINY, *BURST, "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])

    for kind, nodes in (("stock", 1), ("beatless", 3)):
        steady = result["steady"][kind]
        assert steady["nodes"] == nodes
        assert steady["firings"] >= 10, f"{kind}: too few firings in 4 s"
        assert steady["lateness_ms"]["p50"] <= steady["lateness_ms"]["max"]
        assert len(steady["cpu_s_per_node"]) == nodes
        assert steady["redis_calls_per_firing"] > 0
        assert steady["redis_idle_cpu_ms_per_s"] > 0
        assert steady["redis_round_trip_a_second_us_per_s"] > 0
        per_s = steady["redis_cpu_ms_per_s_above_idle"] * steady["seconds"] / 1e3
        assert per_s * 1e6 / steady["firings"] == pytest.approx(
            steady["redis_cpu_us_per_firing_above_idle"]
        )
        above = steady["redis_cpu_us_per_firing_above_idle"]
        assert above < steady["redis_cpu_us_per_firing"]
        split = steady["redis_claim_path_calls_per_firing"]
        upkeep = steady["redis_upkeep_calls_per_node_s"] * nodes * steady["seconds"]
        assert split * steady["firings"] + upkeep == pytest.approx(steady["redis_calls"])
        burst = result["burst"][kind]
        assert burst["entries"] == 200
        assert burst["done"], f"{kind}: the burst was not enqueued within 20 s"
        assert burst["enqueued"] == 200
        assert burst["last_enqueued_after_s"] >= 0

    # Stock beat's one LPUSH per firing is its whole claim path; each beatless firing
    # costs at least its claim, its push and its history note.
    assert 0.8 <= result["steady"]["stock"]["redis_claim_path_calls_per_firing"] <= 1.2
    assert result["steady"]["beatless"]["redis_claim_path_calls_per_firing"] >= 2.5
    assert result["steady"]["beatless"]["redis_upkeep_calls_per_node_s"] > 0
    # One run of beatless beats: no run to compare each node's upkeep with.
    assert "redis_upkeep_us_per_added_node_s" not in result["steady"]["beatless"]

    table = subprocess.run(
        [sys.executable, str(BENCH), "--help"], capture_output=True, text=True, check=True
    )
    assert "--burst" in table.stdout


def test_each_added_node_costs_the_difference_of_the_runs_over_the_nodes_added() -> None:
    sys.path.insert(0, str(BENCH.parent))
    try:
        from celery_redis import added_nodes
    finally:
        sys.path.remove(str(BENCH.parent))
    runs = [
        {"nodes": 3, "redis_cpu_ms_per_s_above_idle": 2.0},
        {"nodes": 10, "redis_cpu_ms_per_s_above_idle": 2.7},
        {"nodes": 3, "redis_cpu_ms_per_s_above_idle": 2.5},
    ]
    added_nodes(runs)
    assert "redis_upkeep_us_per_added_node_s" not in runs[0]
    assert runs[1]["redis_upkeep_us_per_added_node_s"] == pytest.approx(100.0)
    assert "redis_upkeep_us_per_added_node_s" not in runs[2]  # no node added
