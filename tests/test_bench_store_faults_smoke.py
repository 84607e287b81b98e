"""``bench/store_faults.py`` lists its rows, runs the quick ones, and says why it skips one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "store_faults.py"


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bench_lists_every_row_of_the_issue_table() -> None:
    done = run_bench("--list")

    assert done.returncode == 0, done.stderr
    keys = [line.split()[0] for line in done.stdout.splitlines()]
    for key in ("lru-start", "full", "failover-6s-proxy", "restart-empty", "pg-stop-300"):
        assert key in keys
    assert len(keys) == len(set(keys))


@pytest.mark.slow  # three node processes and a private redis-server, about 5 s
def test_an_evicting_redis_row_reads_refused_at_start_and_sentinel_says_why_not_run() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed; the row starts a private one")
    done = run_bench("--rows", "lru-start,failover-sentinel", "--json")

    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        item["row"]: item
        for item in (json.loads(line) for line in done.stdout.splitlines() if line[:1] == "{")
    }
    assert rows["lru-start"]["verdict"] == "met: every node refused at start"
    assert "maxmemory-policy allkeys-lru" in rows["lru-start"]["refused_at_start"]
    assert rows["failover-sentinel"]["verdict"].startswith("not run: ")
    assert "refused at start: " in done.stdout
