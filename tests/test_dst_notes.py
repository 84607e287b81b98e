"""DST notes (``beatless.core._dst``) and the plans that carry them.

Reference timeline, Europe/Paris in 2026 (tz database):

    2026-03-29 01:00:00Z  clocks go forward 02:00 -> 03:00 local (+01:00 -> +02:00):
                          wall times 02:00-02:59 do not exist
    2026-10-25 01:00:00Z  clocks go back 03:00 -> 02:00 local (+02:00 -> +01:00):
                          wall times 02:00-02:59 happen twice, first at 00:xxZ, then 01:xxZ
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from beatless.core._dst import dst_notes
from beatless.core._time import from_datetime, iso
from beatless.core.triggers import Cron, Every
from beatless.live import Live
from beatless.schedule.entry import Entry
from beatless.stores.memory import MemoryStore

YEAR_2026 = (
    from_datetime(datetime(2026, 1, 1, tzinfo=UTC)),
    from_datetime(datetime(2027, 1, 1, tzinfo=UTC)),
)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # fixed time: a skipped wall time runs once at the gap's end, a repeated one once
        (
            "30 2 * * *",
            [
                ("gap", ["2026-03-29T02:30"], ["2026-03-29T01:00:00.000Z"]),
                ("repeat", ["2026-10-25T02:30"], ["2026-10-25T00:30:00.000Z"]),
            ],
        ),
        # two skipped wall times still run once
        (
            "0,30 2 * * *",
            [
                ("gap", ["2026-03-29T02:00", "2026-03-29T02:30"], ["2026-03-29T01:00:00.000Z"]),
                (
                    "repeat",
                    ["2026-10-25T02:00", "2026-10-25T02:30"],
                    ["2026-10-25T00:00:00.000Z", "2026-10-25T00:30:00.000Z"],
                ),
            ],
        ),
        # real time: nothing runs in the gap, a repeated wall time runs at both passes
        (
            "0 * * * *",
            [
                ("gap", ["2026-03-29T02:00"], []),
                (
                    "repeat",
                    ["2026-10-25T02:00"],
                    ["2026-10-25T00:00:00.000Z", "2026-10-25T01:00:00.000Z"],
                ),
            ],
        ),
        # never at the changes' wall times: no note
        ("0 4 * * *", []),
        # Sundays only: both changes are on a Sunday
        (
            "30 2 * * 0",
            [
                ("gap", ["2026-03-29T02:30"], ["2026-03-29T01:00:00.000Z"]),
                ("repeat", ["2026-10-25T02:30"], ["2026-10-25T00:30:00.000Z"]),
            ],
        ),
        # Mondays only: neither is
        ("30 2 * * 1", []),
    ],
)
def test_a_note_for_each_change_that_skips_or_repeats_a_matched_wall_time(
    expr: str, expected: list[tuple[str, list[str], list[str]]]
) -> None:
    notes = dst_notes(Cron(expr, "Europe/Paris"), *YEAR_2026)
    assert [(n.kind, list(n.walls), [iso(r) for r in n.runs]) for n in notes] == expected


def test_a_zone_without_dst_has_no_note() -> None:
    assert dst_notes(Cron("30 2 * * *", "Asia/Tokyo"), *YEAR_2026) == []


def test_the_notes_text_says_what_runs() -> None:
    gap, repeat = dst_notes(Cron("30 2 * * *", "Europe/Paris"), *YEAR_2026)
    assert gap.text() == (
        "2026-03-29T02:30 does not exist in Europe/Paris (clocks go forward at "
        "2026-03-29T01:00:00.000Z): runs once, at 2026-03-29T01:00:00.000Z"
    )
    assert repeat.text() == (
        "2026-10-25T02:30 happens twice in Europe/Paris (clocks go back at "
        "2026-10-25T01:00:00.000Z): runs once, at the first pass, 2026-10-25T00:30:00.000Z"
    )
    (real,) = dst_notes(
        Cron("*/15 * * * *", "Europe/Paris"),
        YEAR_2026[0],
        from_datetime(datetime(2026, 6, 1, tzinfo=UTC)),
    )
    assert real.text().endswith("not run (the expression follows real time)")
    assert real.walls[0] == "2026-03-29T02:00"
    assert len(real.walls) == 4


def test_a_plan_notes_the_dst_changes_of_the_entries_it_puts_within_its_window() -> None:
    live = Live(MemoryStore(), namespace=f"dst-{uuid.uuid4().hex[:8]}", timezone="Europe/Paris")
    entries = [
        Entry(name="night", task="app.night", trigger=Cron("30 2 * * *")),  # the app's zone
        Entry(name="ny", task="app.ny", trigger=Cron("30 1 * * *", "America/New_York")),
        Entry(name="tick", task="app.tick", trigger=Every("1h")),
    ]
    start = from_datetime(datetime(2026, 3, 25, tzinfo=UTC))

    plan = live.plan(entries, "7d", start_ms=start, effective_in=0)

    assert [(name, note.kind, note.zone) for name, note in plan.dst] == [
        ("night", "gap", "Europe/Paris")
    ]
    assert plan.to_json()["dst"][0]["runs"] == ["2026-03-29T01:00:00.000Z"]
    autumn = live.plan(entries, "7d", start_ms=from_datetime(datetime(2026, 10, 30, tzinfo=UTC)))
    assert [(name, note.kind) for name, note in autumn.dst] == [("ny", "repeat")]
