"""The scale benchmark's burst and its floor run end to end with tiny parameters, on Redis."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from service_check import require_service

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale import burst, floor

URL = "redis://127.0.0.1:6379/15"


@pytest.mark.slow
@pytest.mark.serial  # the split between the nodes holds only while neither is starved
@pytest.mark.parametrize("path", ["atomic", "two-phase"])
def test_a_small_burst_is_sent_once_each_and_split_between_the_nodes(path: str) -> None:
    require_service("Redis", "127.0.0.1", 6379)

    # The bench's own lead (14 s): time for both nodes to start and read each other's
    # record before the burst. 8 s was too short on a loaded machine: both claimed.
    result = burst(URL, 2, 300, True, path)

    assert result["exit_codes"] == [0, 0]
    assert (result["sent"], result["missed"], result["duplicates"]) == (300, 0, 0)
    assert result["last_sent_after_s"] is not None
    assert result["claims_per_firing"] < 1.5, "both nodes claimed the firings"
    assert sum(result["won_per_node"]) == 300
    assert min(result["won_per_node"]) > 0, "one node took the whole burst"


@pytest.mark.slow
def test_the_floor_pushes_every_item_and_times_the_last() -> None:
    require_service("Redis", "127.0.0.1", 6379)

    result = floor(URL, 3, 1_000)

    assert result["items"] == 1_000
    assert result["last_pushed_after_s"] is not None
    assert 0 <= result["last_pushed_after_s"] < 30
