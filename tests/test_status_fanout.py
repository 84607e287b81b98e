"""A fan-out entry's coming firings in ``beatless status`` and on the page: each tenant
has an offset of its own, so the entry shows the window its tenants are released over,
never a ``jitter offset 0`` that no tenant has."""

from __future__ import annotations

from test_status import Fleet as StatusFleet

from beatless import Entry, Every, Schedule
from beatless.ops._page import render_page
from beatless.ops.status import render
from beatless.schedule.firing import iso

NS = "status-fanout-test"


def schedule() -> Schedule:
    return Schedule(
        [
            Entry(name="tick", task="t.tick", trigger=Every(10), jitter="2s"),
            Entry(name="fan", task="t.fan", trigger=Every(10), tenants=["a", "b"], jitter="3s"),
        ],
        namespace=NS,
    )


class Fleet(StatusFleet):
    plan = staticmethod(schedule)

    def status(self, plan: Schedule | None = None) -> dict:  # type: ignore[type-arg]
        from beatless.ops.status import report

        return report(self.store, NS, schedule=plan, now_ms=self.clock.now_ms())


def test_a_fan_out_shows_the_window_its_tenants_are_released_over() -> None:
    fleet = Fleet(1)
    fleet.run(2)

    status = fleet.status()
    entries = {e["entry"]: e for e in status["entries"]}

    for upcoming in entries["fan"]["next"]:
        occurrence = upcoming["occurrence"]
        assert upcoming["offset_ms"] is None
        assert upcoming["window_ms"] == 3_000
        assert upcoming["release"] == occurrence
        assert upcoming["release_last"] == iso(_ms(occurrence) + 3_000)
    for upcoming in entries["tick"]["next"]:  # an entry of its own: its one offset
        assert 0 <= upcoming["offset_ms"] < 2_000
        assert upcoming["window_ms"] == 2_000

    text = render(status)
    fan = text[text.index("  fan  ") :]
    first = entries["fan"]["next"][0]
    assert f"{first['release']} to {first['release_last']} (each tenant at its offset)" in fan

    page = render_page(status)
    assert "jitter offset 0.000 s" not in page
    assert "each tenant released at its own offset within the 3.000 s jitter window" in page
    assert 'data-window-ms="3000"' in page


def _ms(instant: str) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(instant).timestamp() * 1_000)
