"""The core benchmark runs end to end with tiny parameters and proves exactly-once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "core.py"
TINY = ["--tenants", "50", "--triggers", "2", "--hours", "0.1", "--json"]


def run_bench(*extra: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(BENCH), *TINY, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_json_has_every_figure_and_each_firing_was_won_exactly_once() -> None:
    result = run_bench("--no-celery")

    assert result["ok"] is True
    assert result["parameters"]["addresses"] == 100
    assert {"wall_s", "cpu_s"} <= result["load"].keys()
    assert {"wall_s", "cpu_s", "firings_planned"} <= result["first_releases"].keys()
    assert {"rss_before_mb", "rss_after_load_mb", "peak_after_one_node_mb"} <= set(result["memory"])
    one = result["one_node"]
    for key in ("cpu_per_hour_s", "firings_per_hour", "us_per_firing", "claim_calls"):
        assert key in one
    assert one["check"] == {**one["check"], "ok": True, "missed": 0, "duplicates": 0}
    assert one["check"]["expected"] == 50  # only the minute-0 trigger falls in 6 minutes
    assert one["enqueued"] == one["won"] == 50
    assert one["claim_calls"] == one["wakes_with_due"]

    three = result["three_nodes"]
    assert three["check"]["ok"] is True
    assert three["check"]["won"] == 50
    assert len(three["nodes"]) == 3
    assert all(node["decided"] == 50 for node in three["nodes"])
    assert sum(node["won"] for node in three["nodes"]) == 50
    assert result["celery_beat"] == {"measured": False, "reason": "--no-celery"}


def test_bench_reports_celery_beat_side_by_side_or_says_why_not() -> None:
    beat = run_bench()["celery_beat"]

    if beat["measured"]:
        assert beat["entries"] == 100
        assert beat["due_wakes_sent"] >= 1
        assert {"load", "rss_after_load_mb", "first_wake_cpu_s", "idle_wake_cpu_s"} <= set(beat)
    else:
        assert beat["reason"]


def test_stores_bench_prints_every_figure_for_the_stores_it_measures() -> None:
    command = [sys.executable, str(BENCH.with_name("stores.py")), "--only", "memory,sqlite"]
    done = subprocess.run(
        [*command, "--seconds", "0.2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    stores = json.loads(done.stdout)["stores"]
    assert [s["store"] for s in stores] == ["memory", "sqlite"]
    for store in stores:
        assert store["claims_per_s_batch_1"] > 0
        assert store["claims_per_s_batch_1000"] > 0
        assert store["ops_per_firing_batch_1000"] == 0.002
    # A batch is one SQLite transaction instead of a thousand: faster by far, however
    # loaded the machine. (In memory a batch saves no round trip; the two rates are
    # within noise of each other, and which is higher tells nothing.)
    assert stores[1]["claims_per_s_batch_1000"] > 2 * stores[1]["claims_per_s_batch_1"]
    assert stores[1]["bytes_per_claim"] > 0
