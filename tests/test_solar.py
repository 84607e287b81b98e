"""The Solar trigger: Celery's solar events, one firing per day and event whatever the
float arithmetic, nothing on polar days, and a clear error without ephem."""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beatless import Entry, Schedule, Solar
from beatless.cli.loader import load_toml
from beatless.core.solar import EVENTS, MIN_GAP_MS
from beatless.core.triggers import occurrence_key
from beatless.errors import ConfigError, ScheduleError
from beatless.fleet._notes import NodeRecord, drift, trigger_of, trigger_spec
from beatless.live.codec import entry_from_json, entry_to_json
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import Firing, firing_id, from_datetime, iso
from beatless.stores.memory import MemoryStore

ephem = pytest.importorskip("ephem")
celery_schedules = pytest.importorskip("celery.schedules")

BERLIN = (52.52, 13.405)
SVALBARD = (78.22, 15.65)  # Longyearbyen: midnight sun from 19 April, no sunset until August


def ms(text: str) -> int:
    return from_datetime(datetime.fromisoformat(text))


def take(trigger: Solar, after: str, count: int = 3) -> list[int]:
    return list(islice(trigger.after(ms(after)), count))


def celery_next(event: str, lat: float, lon: float, after_ms: int) -> int:
    """The next event after ``after_ms`` as Celery's own solar schedule computes it."""
    found = celery_schedules.solar(event, lat, lon)._next_event(
        ephem.Date(datetime.fromtimestamp(after_ms / 1_000, UTC).replace(tzinfo=None))
    )
    return from_datetime(found.datetime().replace(tzinfo=UTC))


@pytest.mark.parametrize("event", sorted(EVENTS))
@pytest.mark.parametrize(
    ("lat", "lon"), [BERLIN, (-33.87, 151.21), (40.71, -74.01), (0.0, -179.5), (64.15, -21.94)]
)
def test_each_event_falls_where_celerys_solar_puts_it(event: str, lat: float, lon: float) -> None:
    trigger = Solar(event, lat, lon)
    for occurrence in take(trigger, "2026-03-01T00:00:00+00:00", 40):
        ours = trigger.after(occurrence - 3_600_000)
        theirs = celery_next(event, lat, lon, occurrence - 3_600_000)
        # ephem converges from where its search starts: the two agree within a second
        assert abs(next(ours) - theirs) <= 1_000, (event, iso(occurrence), iso(theirs))


def test_sunrise_in_berlin_on_the_solstice_with_its_key() -> None:
    trigger = Solar("sunrise", *BERLIN)
    found = take(trigger, "2026-06-20T12:00:00+00:00", 2)
    assert [iso(o)[:16] for o in found] == ["2026-06-21T02:43", "2026-06-22T02:43"]
    assert [trigger.key(o) for o in found] == ["sunrise/2026-06-21", "sunrise/2026-06-22"]
    assert trigger.describe() == "solar sunrise at 52.52, 13.405"


@settings(max_examples=150, deadline=None)
@given(
    event=st.sampled_from(sorted(EVENTS)),
    lat=st.floats(-66, 66),
    lon=st.floats(-180, 180),
    day=st.integers(0, 3_650),
    skew=st.sampled_from([-1, 1]),
)
def test_two_computations_a_millisecond_apart_derive_one_firing_id(
    event: str, lat: float, lon: float, day: int, skew: int
) -> None:
    entry = Entry(name="lights", task="t", trigger=Solar(event, lat, lon))
    address = Schedule([entry], namespace="ns").address(entry)
    start = ms("2026-01-01T00:00:00+00:00") + day * 86_400_000
    occurrence = next(entry.trigger.after(start), None)
    if occurrence is None:
        return  # the sun does not reach this horizon here for two years
    ours = Firing.of(entry, None, address, occurrence)
    theirs = Firing.of(entry, None, address, occurrence + skew)
    assert theirs.id == ours.id
    assert theirs.offset_ms == ours.offset_ms
    # keyed by the instant, the two nodes would claim two firings
    assert firing_id(address, occurrence) != firing_id(address, occurrence + skew)


def test_celery_and_beatless_a_few_ms_apart_claim_one_firing() -> None:
    # Celery searches from the last run, beatless from the start of the solar day: ephem
    # converges to instants a few milliseconds apart (2 ms for this dusk).
    entry = Entry(name="dusk", task="t", trigger=Solar("dusk_civil", *BERLIN))
    (ours,) = take(entry.trigger, "2026-06-20T00:00:00+00:00", 1)  # type: ignore[arg-type]
    theirs = celery_next("dusk_civil", *BERLIN, ms("2026-06-20T00:00:00+00:00"))
    assert ours != theirs
    assert (
        Firing.of(entry, None, "ns/dusk", ours).id == Firing.of(entry, None, "ns/dusk", theirs).id
    )


@pytest.mark.parametrize("event", ["sunrise", "sunset", "solar_noon", "dusk_astronomical"])
def test_the_key_holds_for_an_instant_hours_off(event: str) -> None:
    trigger = Solar(event, *SVALBARD)
    for occurrence in take(trigger, "2026-02-20T00:00:00+00:00", 30):
        for off_h in (-5, -1, 1, 5):
            assert trigger.key(occurrence + off_h * 3_600_000) == trigger.key(occurrence)
        assert occurrence_key(trigger, occurrence) == trigger.key(occurrence)


def test_no_sunrise_or_sunset_on_polar_days_and_the_next_is_celerys() -> None:
    # Longyearbyen: the last sunset on 17 April, the last sunrise just after midnight
    # (local solar) on the 18th, then the midnight sun until late August.
    expected = {
        "sunrise": ["sunrise/2026-04-18", "sunrise/2026-08-25", "sunrise/2026-08-26"],
        "sunset": ["sunset/2026-04-17", "sunset/2026-08-24", "sunset/2026-08-25"],
    }
    for event, keys in expected.items():
        trigger = Solar(event, *SVALBARD)
        found = take(trigger, "2026-04-17T12:00:00+00:00", 3)
        assert [trigger.key(o) for o in found] == keys
        theirs = celery_next(event, *SVALBARD, found[0])
        assert found[1] == pytest.approx(theirs, abs=1_000)


def test_no_astronomical_dusk_on_white_nights() -> None:
    # In Berlin the sun stays above -18 degrees all night from 17 May to 24 July 2026.
    trigger = Solar("dusk_astronomical", *BERLIN)
    found = take(trigger, "2026-05-15T00:00:00+00:00", 4)
    assert [trigger.key(o) for o in found] == [
        "dusk_astronomical/2026-05-15",
        "dusk_astronomical/2026-05-16",
        "dusk_astronomical/2026-07-25",
        "dusk_astronomical/2026-07-26",
    ]
    theirs = celery_next("dusk_astronomical", *BERLIN, found[1])
    assert found[2] == pytest.approx(theirs, abs=1_000)


def test_across_dst_the_instants_move_minutes_not_an_hour() -> None:
    # Europe/Berlin skips 02:00 -> 03:00 on 29 March 2026 and repeats 02:00-03:00 on 25
    # October: the sun does not, so in UTC the sunrise moves by a couple of minutes a day
    # and every local solar date has one.
    trigger = Solar("sunrise", *BERLIN)
    for after in ("2026-03-26T00:00:00+00:00", "2026-10-22T00:00:00+00:00"):
        found = take(trigger, after, 7)
        assert all(
            timedelta(hours=23, minutes=55)
            < timedelta(milliseconds=b - a)
            < timedelta(hours=24, minutes=5)
            for a, b in pairwise(found)
        )
        dates = [trigger.key(o).rpartition("/")[2] for o in found]
        assert len(set(dates)) == 7
    berlin = ZoneInfo("Europe/Berlin")
    for after, utc, wall in (
        ("2026-03-27T12:00", ["2026-03-28T04:50", "2026-03-29T04:48"], ["05:50", "06:48"]),
        ("2026-10-23T12:00", ["2026-10-24T05:47", "2026-10-25T05:49"], ["07:47", "06:49"]),
    ):
        found = take(trigger, after + ":00+00:00", 2)
        assert [iso(o)[:16] for o in found] == utc
        local = [datetime.fromtimestamp(o / 1_000, berlin).strftime("%H:%M") for o in found]
        assert local == wall


def test_occurrences_keep_the_shortest_gap() -> None:
    for event in EVENTS:
        found = take(Solar(event, *SVALBARD), "2026-01-01T00:00:00+00:00", 200)
        assert min(b - a for a, b in pairwise(found)) >= MIN_GAP_MS


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("noon", 0, 0), "unknown event 'noon'; use one of dawn_astronomical"),
        (("sunrise", 91, 0), "latitude must be a number of degrees from -90 to 90, got 91"),
        (("sunrise", 0, -181), "longitude must be a number of degrees from -180 to 180"),
        (("sunrise", True, 0), "latitude must be a number"),
        (("sunrise", "52", 0), "latitude must be a number"),
    ],
)
def test_bad_solar_arguments_are_named(args: tuple[object, ...], said: str) -> None:
    with pytest.raises(ConfigError, match="solar") as caught:
        Solar(*args)  # type: ignore[arg-type]
    assert said in str(caught.value)


def test_without_ephem_a_solar_trigger_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ephem", None)  # as if it were not installed
    with pytest.raises(ConfigError) as caught:
        Solar("sunrise", *BERLIN)
    assert "the solar trigger needs the ephem package" in str(caught.value)
    assert "pip install 'beatless[solar]'" in str(caught.value)


# -- every front end, the notes and the registry -----------------------------------------


def test_a_toml_entry_takes_solar_with_lat_and_lon(tmp_path: Path) -> None:
    path = tmp_path / "schedule.toml"
    path.write_text(
        '[[entry]]\nname = "lights"\ntask = "garden.lights"\nsolar = "sunset"\n'
        "lat = 52.52\nlon = 13.405\n"
        '[[entry]]\nname = "odd"\ntask = "t"\nsolar = "sunset"\nlat = 52.52\n'
        '[[entry]]\nname = "zoned"\ntask = "t"\nsolar = "dawn_civil"\nlat = 1\nlon = 2\n'
        'timezone = "UTC"\n'
    )
    with pytest.raises(ScheduleError) as caught:
        load_toml(path)
    assert caught.value.errors == [
        "entry 'odd': 'solar' needs 'lon' in degrees",
        "entry 'zoned': 'timezone' does not apply to 'solar' (the sun keeps no time zone)",
    ]
    path.write_text(path.read_text().split('[[entry]]\nname = "odd"')[0])
    (entry,) = load_toml(path).entries
    assert entry.trigger == Solar("sunset", 52.52, 13.405)


def test_a_dramatiq_actor_declares_a_solar_periodic() -> None:
    from beatless.dramatiq import solar

    declared = solar("sunrise", *BERLIN, jitter="1m")
    assert declared.trigger == Solar("sunrise", *BERLIN)
    assert declared.problems == ()
    assert solar("noon", 0, 0).problems == (
        "solar: unknown event 'noon'; use one of " + ", ".join(EVENTS),
    )


def test_a_solar_entry_is_kept_live_and_published_as_itself() -> None:
    entry = Entry(name="lights", task="t", trigger=Solar("dusk_civil", *BERLIN), jitter="30s")
    data = entry_to_json(entry)
    assert data["v"] == 2
    assert data["trigger"] == {"solar": "dusk_civil", "lat": 52.52, "lon": 13.405}
    back = entry_from_json(data)
    assert back.trigger == entry.trigger
    assert entry_to_json(back) == data
    assert trigger_of(trigger_spec(entry.trigger)) == entry.trigger


def test_the_registry_records_the_ephem_version_and_status_names_a_difference() -> None:
    entry = Entry(name="lights", task="t", trigger=Solar("sunset", *BERLIN))
    node = Scheduler(Schedule([entry]), store=MemoryStore(), node="a", enqueue=print)
    record = node.board.node_record(node.now_ms())
    assert record.ephem == ephem.__version__
    assert NodeRecord.parse(record.to_json()).ephem == ephem.__version__
    other = replace(record, node="b", ephem="4.1.4")
    without = replace(record, node="c", ephem=None)  # a node with no solar entry needs none
    assert drift([record, other, without]) == [
        f"live nodes run different ephem versions: 4.1.4 on b; {ephem.__version__} on {record.node}"
    ]
