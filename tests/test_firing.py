"""Firing ids and offsets: the arithmetic every node must agree on."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beatless.core.triggers import Every
from beatless.schedule.entry import Entry
from beatless.schedule.firing import (
    Firing,
    digest,
    firing_id,
    from_datetime,
    iso,
    offset_ms,
    to_datetime,
)

ADDRESSES = st.text(min_size=1, max_size=40)
OCCURRENCES = st.integers(0, 2**45)
WINDOWS = st.integers(1, 7 * 86_400_000)


def reference_id(address: str, occurrence: int) -> str:
    d = hashlib.sha256(f"{address}@{occurrence}".encode()).digest()
    return str(uuid.UUID(bytes=d[:16]))


def reference_offset(address: str, occurrence: int, window: int) -> int:
    d = hashlib.sha256(f"{address}@{occurrence}".encode()).digest()
    return window * (int.from_bytes(d[:8], "big") >> 11) // 2**53


def test_known_vector_pins_the_id_and_offset() -> None:
    address, occurrence = "default/reports.nightly", 1_767_225_600_000  # 2026-01-01T00:00Z
    assert firing_id(address, occurrence) == "ecd6f7d6-32ac-d0a1-8b0b-4a689329c6a2"
    assert offset_ms(address, occurrence, 120_000) == 111_018


@settings(max_examples=300)
@given(address=ADDRESSES, occurrence=OCCURRENCES, window=st.integers(0, 2**40))
def test_id_and_offset_follow_the_documented_formulas(
    address: str, occurrence: int, window: int
) -> None:
    assert firing_id(address, occurrence) == reference_id(address, occurrence)
    assert offset_ms(address, occurrence, window) == reference_offset(address, occurrence, window)
    assert (
        digest(address, occurrence) == hashlib.sha256(f"{address}@{occurrence}".encode()).digest()
    )


@settings(max_examples=300)
@given(address=ADDRESSES, occurrence=OCCURRENCES, window=WINDOWS)
def test_offset_is_always_inside_the_window(address: str, occurrence: int, window: int) -> None:
    assert 0 <= offset_ms(address, occurrence, window) < window


@given(address=ADDRESSES, occurrence=OCCURRENCES)
def test_offset_is_zero_without_a_window(address: str, occurrence: int) -> None:
    assert offset_ms(address, occurrence, 0) == 0


def _entry(jitter: float) -> Entry:
    return Entry(name="sync", task="app.sync", trigger=Every(300), jitter=jitter, max_late=200)


@settings(max_examples=100)
@given(
    address=ADDRESSES,
    occurrence=OCCURRENCES,
    jitters=st.tuples(st.integers(0, 150), st.integers(0, 150)),
)
def test_changing_the_jitter_never_changes_the_id(
    address: str, occurrence: int, jitters: tuple[int, int]
) -> None:
    first, second = (Firing.of(_entry(j), None, address, occurrence) for j in jitters)
    assert first.id == second.id
    assert first.occurrence_ms == second.occurrence_ms == occurrence
    assert first.offset_ms == reference_offset(address, occurrence, jitters[0] * 1000)
    assert first.release_ms == occurrence + first.offset_ms


def test_firing_exposes_occurrence_and_release_as_utc_datetimes() -> None:
    firing = Firing.of(_entry(120), "acme", "default/sync/acme", 1_767_225_600_000)
    assert firing.occurrence == datetime(2026, 1, 1, tzinfo=UTC)
    assert firing.release == firing.occurrence + timedelta(milliseconds=firing.offset_ms)
    assert firing.tenant == "acme"


_CHILD = """
import json, sys
from beatless.schedule.firing import firing_id, offset_ms
batch = json.load(sys.stdin)
json.dump([[firing_id(a, t), offset_ms(a, t, w)] for a, t, w in batch], sys.stdout)
"""


@settings(max_examples=3, deadline=None)
@given(
    batch=st.lists(st.tuples(ADDRESSES, OCCURRENCES, WINDOWS), min_size=50, max_size=50),
)
def test_another_process_derives_the_same_ids_and_offsets(
    batch: list[tuple[str, int, int]],
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    theirs = json.loads(result.stdout)
    ours = [[firing_id(a, t), offset_ms(a, t, w)] for a, t, w in batch]
    assert theirs == ours


def chi_square(offsets: list[int], window: int, buckets: int) -> float:
    counts = [0] * buckets
    for offset in offsets:
        counts[offset * buckets // window] += 1
    expected = len(offsets) / buckets
    return sum((c - expected) ** 2 / expected for c in counts)


# The 99.9th percentile of chi-square with 19 degrees of freedom is 43.8; a fixed offset
# (0 or window/2) puts every tenant in one bucket and scores 190,000.
CHI_SQUARE_19_DF_999 = 43.8


def test_offsets_of_ten_thousand_tenants_spread_uniformly_over_the_window() -> None:
    window, occurrence = 120_000, 1_767_225_600_000
    offsets = [offset_ms(f"default/report/tenant-{i}", occurrence, window) for i in range(10_000)]
    assert chi_square(offsets, window, 20) < CHI_SQUARE_19_DF_999


@pytest.mark.parametrize("broken", [lambda w: 0, lambda w: w // 2, lambda w: w * 3 // 4])
def test_the_uniformity_check_rejects_a_fixed_offset(broken: object) -> None:
    window = 120_000
    offsets = [broken(window) for _ in range(10_000)]  # type: ignore[operator]
    assert chi_square(offsets, window, 20) > CHI_SQUARE_19_DF_999


@given(st.integers(-(2**45), 2**45))
def test_epoch_milliseconds_round_trip_through_datetime(instant: int) -> None:
    moment = to_datetime(instant)
    assert moment.tzinfo is not None
    assert moment.utcoffset() == timedelta(0)
    assert from_datetime(moment) == instant


def test_from_datetime_reads_any_aware_zone() -> None:
    moment = datetime(2026, 1, 1, 2, 0, 0, 123_999, tzinfo=timezone(timedelta(hours=2)))
    assert from_datetime(moment) == 1_767_225_600_123


def test_from_datetime_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="naive"):
        from_datetime(datetime(2026, 1, 1))


def test_iso_writes_utc_with_milliseconds_and_z() -> None:
    assert iso(1_767_225_600_000) == "2026-01-01T00:00:00.000Z"
    assert iso(1_767_225_600_007) == "2026-01-01T00:00:00.007Z"
    assert iso(0) == "1970-01-01T00:00:00.000Z"
