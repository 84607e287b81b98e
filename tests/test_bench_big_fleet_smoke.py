"""The big-fleet benchmark runs end to end with tiny parameters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from service_check import require_binary

BENCH = Path(__file__).resolve().parent.parent / "bench" / "big_fleet.py"
TINY = ["--entries", "300", "--nodes", "2", "--seconds", "3", "--settle", "1", "--json"]


@pytest.mark.slow
def test_bench_measures_a_fleet_on_a_schedule_that_does_not_fire() -> None:
    if shutil.which("redis-server") is None:
        require_binary("redis-server is not on PATH: the benchmark starts a private one")
    root = str(BENCH.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(BENCH), *TINY],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["entries"], result["nodes"]) == (300, 2)
    assert result["seconds"] >= 3
    assert result["redis_idle_cpu_ms_per_s"] > 0
    # Two nodes post their own notes at every sync, a second apart.
    assert result["hset_calls"] >= 2
    assert isinstance(result["redis_cpu_ms_per_s_above_idle"], float)
    assert result["entry_notes_per_minute"] >= 0
    assert result["longest_command_ms"] >= 0
    assert result["slow_commands"] >= 0
