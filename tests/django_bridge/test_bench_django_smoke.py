"""``bench/django_bridge.py --quick`` runs end to end: 500 rows published, then polled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "django_bridge.py"


@pytest.mark.slow
def test_the_quick_django_bench_publishes_every_row_and_times_each_poll() -> None:
    env = {**os.environ, "PYTHONPATH": str(BENCH.parents[1])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    (found,) = json.loads(done.stdout.splitlines()[-1])["results"]
    assert found["rows"] == 500
    assert all(found[key] > 0 for key in ("first_poll_s", "idle_poll_ms", "one_edit_ms"))
