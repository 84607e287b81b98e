"""The big-schedule benchmark runs end to end with a small count and prints every figure:
``check``, a node's start and ``status``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "big_schedule.py"


@pytest.mark.slow  # eight child processes, each importing beatless: a few seconds
@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_big_schedule_bench_checks_and_starts_a_node_for_both_kinds(store: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--entries", "300", "--store", store, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["entries"] == 300
    assert result["store"] == store
    assert set(result["kinds"]) == {"cron", "every"}
    for kind, figures in result["kinds"].items():
        assert 1 < figures["distinct_triggers"] <= 300, kind
        check, node, status = figures["check"], figures["node"], figures["status"]
        assert check["exit"] == 0, (kind, check["stderr"])
        assert node["exit"] == 0, (kind, node["stderr"])
        assert status["exit"] in (0, 1), (kind, status["stderr"])  # 1: problems listed
        assert figures["status_json"]["exit"] == status["exit"], figures["status_json"]
        for part in (check, node, status, figures["status_json"]):
            assert part["wall_s"] > 0
            assert part["cpu_s"] > 0
            assert part["peak_rss_mb"] > 10
        assert {"load_s", "build_s", "first_wake_s"} <= node.keys()
    assert isinstance(result["within_goal"], bool)
