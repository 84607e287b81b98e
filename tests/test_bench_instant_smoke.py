"""The instant benchmark runs end to end with tiny parameters: every message it sends is
popped once, in each mode, and its figures are there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from service_check import require_binary

BENCH = Path(__file__).resolve().parent.parent / "bench" / "instant.py"


def test_bench_pops_every_message_of_each_instant_once_in_each_mode() -> None:
    if shutil.which("redis-server") is None:
        require_binary("redis-server is not on PATH: the benchmark starts a private one")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "4", "--rounds", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])["results"]

    assert [r["mode"] for r in results] == ["beatless", "lpush", "lpush-one"]
    for result in results:
        # Five rounds of warm-up and two counted, four messages each.
        assert result["popped"] == result["sent"] == 4 * 7, result
        assert result["messages"] == 4 * 2, result
        late = result["lateness_ms"]
        assert 0 <= late["p50"] <= late["p99"] <= late["max"], result
        assert result["woke_ms"] >= 0, result
