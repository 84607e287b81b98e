"""Celery's ``solar(...)`` and django-celery-beat's ``clocked(...)`` in a ``beat_schedule``:
read into beatless triggers, sent through Celery by one node of several."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery

from beatless.celery import check_app, read_schedule
from beatless.core.solar import Solar
from beatless.core.triggers import At
from beatless.node.scheduler import Scheduler
from beatless.schedule.entry import Schedule
from beatless.schedule.firing import Firing, from_datetime, iso
from beatless.stores.memory import MemoryStore

ephem = pytest.importorskip("ephem")
schedules = pytest.importorskip("celery.schedules")
clockedschedule = pytest.importorskip("django_celery_beat.clockedschedule")

BERLIN = (52.52, 13.405)


def make_app(beat_schedule: dict[str, Any], **conf: Any) -> Celery:
    app = Celery("proj", broker="memory://")
    app.conf.update(beat_schedule=beat_schedule, beatless_store_url="memory://", **conf)
    return app


def test_a_solar_entry_runs_at_celerys_instant_keyed_by_its_day() -> None:
    app = make_app(
        {"lights": {"task": "garden.lights", "schedule": schedules.solar("sunset", *BERLIN)}}
    )
    (entry,) = read_schedule(app).entries
    assert entry.trigger == Solar("sunset", *BERLIN)
    start = datetime(2026, 6, 20, 12, tzinfo=UTC)
    occurrence = next(entry.trigger.after(from_datetime(start)))
    celerys = start + schedules.solar("sunset", *BERLIN, nowfun=lambda: start).remaining_estimate(
        start
    )
    assert abs(occurrence - from_datetime(celerys)) <= 1_000
    assert iso(occurrence)[:16] == "2026-06-20T19:33"
    assert entry.trigger.key(occurrence) == "sunset/2026-06-20"  # type: ignore[attr-defined]


def test_a_solar_entry_with_a_bad_latitude_names_the_entry() -> None:
    bad = schedules.solar("sunrise", 0, 0)
    bad.lat = 95  # Celery checks at construction; a value set later is read as it is
    found = check_app(make_app({"dawn": {"task": "t", "schedule": bad}}))
    assert found.schedule is None
    assert any(
        p.startswith("entry 'dawn': solar sunrise: latitude must be a number of degrees")
        for p in found.problems
    ), found.problems


def test_without_ephem_only_the_solar_entry_is_a_problem_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sunrise = schedules.solar("sunrise", *BERLIN)  # built while ephem is there
    monkeypatch.setitem(sys.modules, "ephem", None)  # then gone, as on a node without it
    found = check_app(
        make_app(
            {
                "dawn": {"task": "t", "schedule": sunrise},
                "tick": {"task": "t", "schedule": 10},
            }
        )
    )
    (problem,) = found.problems
    assert problem.startswith("entry 'dawn': the solar trigger needs the ephem package")
    assert "pip install 'beatless[solar]'" in problem


def test_a_clocked_schedule_is_a_one_off_at_its_instant() -> None:
    when = datetime(2027, 1, 1, 9, 30, tzinfo=UTC)
    naive = datetime(2027, 1, 1, 9, 30)  # clocked reads a naive time as UTC
    app = make_app(
        {
            "migrate": {"task": "ops.migrate", "schedule": clockedschedule.clocked(when)},
            "naive": {"task": "ops.migrate", "schedule": clockedschedule.clocked(naive)},
        }
    )
    entries = {e.name: e for e in read_schedule(app).entries}
    assert entries["migrate"].trigger == At(when)
    assert entries["naive"].trigger == At(when)
    assert list(entries["migrate"].trigger.after(from_datetime(when) - 1)) == [from_datetime(when)]


def test_a_solar_firing_is_sent_once_by_two_nodes_that_compute_it_a_millisecond_apart() -> None:
    class LaterBuild(Solar):
        """The same event computed 1 ms later, as another ephem build or libm may."""

        def on_day(self, day: int) -> int | None:
            found = Solar.on_day(self, day)
            return None if found is None else found + 1

    beat_schedule = {
        "lights": {"task": "garden.lights", "schedule": schedules.solar("sunset", *BERLIN)}
    }
    schedule = read_schedule(make_app(beat_schedule))
    (entry,) = schedule.entries
    other = Schedule(
        [entry.replace(trigger=LaterBuild("sunset", *BERLIN))],
        namespace=schedule.namespace,
        timezone=schedule.timezone,
    )
    occurrence = next(entry.trigger.after(from_datetime(datetime(2026, 6, 20, tzinfo=UTC))))
    now_ms = [occurrence - 3_000]
    store = MemoryStore(clock=lambda: now_ms[0] / 1_000)
    sent: list[Firing] = []
    nodes = [
        Scheduler(s, store=store, clock=lambda: now_ms[0] / 1_000, node=n, enqueue=sent.append)
        for n, s in (("a", schedule), ("b", other))
    ]
    for _ in range(60):
        now_ms[0] += 100
        for node in nodes:
            node.tick()
    (firing,) = sent
    assert firing.occurrence_ms in (occurrence, occurrence + 1)
    assert firing.id == Firing.of(entry, None, schedule.address(entry), occurrence).id
    assert sorted(n.stats["lights"].won for n in nodes) == [0, 1]
    assert sorted(n.stats["lights"].lost for n in nodes) == [0, 1]
