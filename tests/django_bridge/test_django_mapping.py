"""django-celery-beat rows, created through the ORM as the admin creates them, as entries."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab

from beatless.celery._settings import CelerySettings
from beatless.core._time import from_datetime, iso, to_datetime
from beatless.core.solar import Solar
from beatless.core.triggers import At, Cron, Every
from beatless.django import Row, RowRefused, entry_of_row, row_of
from beatless.schedule.entry import Schedule
from beatless.schedule.firing import Firing

FENCE = from_datetime(datetime(2026, 6, 1, 12, 0, 0, 500_000, tzinfo=UTC))


@pytest.fixture
def settings() -> CelerySettings:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(timezone="Asia/Tokyo", beatless_store_url="memory://", beatless_jitter=2)
    return CelerySettings.from_app(app)


def admin_row(**fields: Any) -> Any:
    """A PeriodicTask saved as the admin saves it (validated, then saved), read back with
    its schedule row."""
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask(**{"task": "proj.report", **fields})
    task.full_clean()
    task.save()
    return PeriodicTask.objects.select_related("crontab", "interval", "clocked", "solar").get(
        pk=task.pk
    )


def crontab_row(**fields: Any) -> Any:
    from django_celery_beat.models import CrontabSchedule

    schedule = CrontabSchedule(**fields)
    schedule.full_clean()
    schedule.save()
    return schedule


def entry(row: Any, settings: CelerySettings, fence: int = FENCE) -> Any:
    return entry_of_row(row_of(row), settings, fence_ms=fence)


def after(trigger: Any, start: datetime, count: int) -> list[datetime]:
    return [to_datetime(o) for o in islice(trigger.after(from_datetime(start)), count)]


def test_a_crontab_row_runs_in_its_own_time_zone_with_celerys_and_day_rule(
    database: str, settings: CelerySettings
) -> None:
    paris = crontab_row(minute="30", hour="4", timezone=ZoneInfo("Europe/Paris"))
    made = entry(admin_row(name="paris", crontab=paris), settings)
    assert made.trigger == Cron("30 4 * * *", "Europe/Paris", day_and=True)
    assert after(made.trigger, datetime(2026, 6, 1, tzinfo=UTC), 1) == [
        datetime(2026, 6, 1, 2, 30, tzinfo=UTC)
    ]
    friday_13 = crontab_row(
        minute="0", hour="9", day_of_month="13", day_of_week="5", timezone=ZoneInfo("UTC")
    )
    made = entry(admin_row(name="friday-13", crontab=friday_13), settings)
    days = after(made.trigger, datetime(2026, 1, 1, tzinfo=UTC), 3)
    assert [d.date().isoformat() for d in days] == ["2026-02-13", "2026-03-13", "2026-11-13"]


@pytest.mark.parametrize(
    ("fields", "zone"),
    [
        ({"minute": "*/20", "hour": "8-17", "day_of_week": "mon-fri"}, "America/New_York"),
        ({"minute": "0", "hour": "0", "day_of_month": "1,15", "day_of_week": "0"}, "UTC"),
        ({"minute": "5", "hour": "*/6", "month_of_year": "2-4"}, "Asia/Kolkata"),
    ],
)
def test_a_crontab_row_matches_the_minutes_celerys_crontab_expands_to(
    database: str, settings: CelerySettings, fields: dict[str, str], zone: str
) -> None:
    """Every minute of 120 days (a DST change included) checked against the sets Celery's
    own crontab expands the row's fields to, all five required (its AND day rule)."""
    row = admin_row(name="cron", crontab=crontab_row(**fields, timezone=ZoneInfo(zone)))
    made = entry(row, settings)
    theirs = crontab(**fields)
    start = datetime(2026, 1, 20, tzinfo=UTC)
    end = start + timedelta(days=120)
    expected = []
    minute = start + timedelta(minutes=1)
    while minute < end:
        local = minute.astimezone(ZoneInfo(zone))
        if (
            local.minute in theirs.minute
            and local.hour in theirs.hour
            and local.day in theirs.day_of_month
            and local.month in theirs.month_of_year
            and local.isoweekday() % 7 in theirs.day_of_week
        ):
            expected.append(minute)
        minute += timedelta(minutes=1)
    ours = after(made.trigger, start, len(expected) + 1)
    assert expected
    assert ours[:-1] == expected
    assert ours[-1] >= end


def test_an_interval_row_is_anchored_at_its_start_time_else_at_the_epoch(
    database: str, settings: CelerySettings
) -> None:
    from django_celery_beat.models import IntervalSchedule

    every = IntervalSchedule.objects.create(every=90, period=IntervalSchedule.SECONDS)
    start = datetime(2026, 6, 1, 0, 0, 10, tzinfo=UTC)
    made = entry(admin_row(name="anchored", interval=every, start_time=start), settings)
    assert made.trigger == Every(timedelta(seconds=90), start)
    assert made.start_at == start
    assert after(made.windowed, datetime(2026, 5, 1, tzinfo=UTC), 2) == [
        start,
        start + timedelta(seconds=90),
    ]
    made = entry(admin_row(name="epoch", interval=every), settings)
    assert made.trigger == Every(timedelta(seconds=90))
    days = IntervalSchedule.objects.create(every=2, period=IntervalSchedule.DAYS)
    assert entry(admin_row(name="days", interval=days), settings).trigger == Every("2d")


def test_a_clocked_one_off_row_is_one_occurrence_at_its_clocked_time(
    database: str, settings: CelerySettings
) -> None:
    from django_celery_beat.models import ClockedSchedule

    when = datetime(2026, 6, 2, 8, 0, tzinfo=UTC)
    clocked = ClockedSchedule.objects.create(clocked_time=when)
    made = entry(admin_row(name="once", clocked=clocked, one_off=True), settings)
    assert made.trigger == At(when)


def test_a_one_off_row_keeps_only_its_first_occurrence_at_or_after_the_fence(
    database: str, settings: CelerySettings
) -> None:
    from django_celery_beat.models import IntervalSchedule

    hourly = crontab_row(minute="0", timezone=ZoneInfo("UTC"))
    made = entry(admin_row(name="next-hour", crontab=hourly, one_off=True), settings)
    assert made.trigger == At(datetime(2026, 6, 1, 13, 0, tzinfo=UTC))
    on_fence = entry(admin_row(name="on-fence", crontab=hourly, one_off=True), settings, 0)
    assert on_fence.trigger == At(0)  # an occurrence on the fence itself is kept
    every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.HOURS)
    late = datetime(2026, 6, 1, 12, 30, tzinfo=UTC)
    made = entry(admin_row(name="from", interval=every, one_off=True, start_time=late), settings)
    assert made.trigger == At(late)
    gone = admin_row(name="gone", crontab=hourly, one_off=True, expires=late)
    with pytest.raises(RowRefused, match=r"'gone'.*one_off: no occurrence"):
        entry(gone, settings)


def test_routing_headers_expiry_window_and_arguments_become_options(
    database: str, settings: CelerySettings
) -> None:
    from django_celery_beat.models import IntervalSchedule

    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    start = datetime(2026, 6, 1, tzinfo=UTC)
    expires = datetime(2026, 7, 1, tzinfo=UTC)
    made = entry(
        admin_row(
            name="routed",
            interval=every,
            args='[1, "two"]',
            kwargs='{"to": "ops"}',
            queue="slow",
            exchange="reports",
            routing_key="reports.daily",
            priority=7,
            headers='{"tenant": "acme"}',
            start_time=start,
            expires=expires,
        ),
        settings,
    )
    assert (made.name, made.task, made.args, made.kwargs) == (
        "routed",
        "proj.report",
        (1, "two"),
        {"to": "ops"},
    )
    assert made.options == {
        "queue": "slow",
        "exchange": "reports",
        "routing_key": "reports.daily",
        "priority": 7,
        "expires": "2026-07-01T00:00:00.000Z",
        "headers": {"tenant": "acme", "periodic_task_name": "routed"},
    }
    assert (made.start_at, made.end_at, made.enabled) == (start, expires, True)
    assert made.jitter == timedelta(seconds=2)  # the app's beatless_jitter


def test_expire_seconds_disabled_rows_and_empty_columns(
    database: str, settings: CelerySettings
) -> None:
    from django_celery_beat.models import IntervalSchedule

    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    made = entry(
        admin_row(name="plain", interval=every, expire_seconds=30, enabled=False, args=""),
        settings,
    )
    assert made.options == {"expires": 30, "headers": {"periodic_task_name": "plain"}}
    assert made.enabled is False
    assert made.args == ()


@pytest.mark.parametrize(
    ("event", "lat", "lon"),
    [("sunrise", "48.85", "2.35"), ("dusk_civil", "-33.868820", "151.209296")],
)
def test_a_solar_row_runs_where_celerys_solar_of_that_row_puts_it(
    database: str, settings: CelerySettings, event: str, lat: str, lon: str
) -> None:
    from django_celery_beat.models import SolarSchedule

    ephem = pytest.importorskip("ephem")
    solar = SolarSchedule(event=event, latitude=Decimal(lat), longitude=Decimal(lon))
    solar.full_clean()
    solar.save()
    row = admin_row(name="dawn", solar=solar)
    made = entry(row, settings)
    assert made.trigger == Solar(event, float(lat), float(lon))
    theirs = row.solar.schedule  # django-celery-beat's own Celery solar of the row
    start = datetime(2026, 3, 1, tzinfo=UTC)
    found = [from_datetime(d) for d in after(made.trigger, start, 30)]
    for occurrence in found:
        search = to_datetime(occurrence - 3_600_000).replace(tzinfo=None)
        celery = theirs._next_event(ephem.Date(search)).datetime().replace(tzinfo=UTC)
        # ephem converges from where its search starts: the two agree within a second
        assert abs(occurrence - from_datetime(celery)) <= 1_000, iso(occurrence)
    # one firing per address, local solar date and event, whatever each node computes
    address = Schedule([made], namespace="proj").address(made)
    first = Firing.of(made, None, address, found[0])
    assert made.trigger.key(found[0]) == f"{event}/2026-03-01"  # type: ignore[attr-defined]
    assert Firing.of(made, None, address, found[0] + 1).id == first.id
    assert Firing.of(made, None, address, found[1]).id != first.id


def test_without_ephem_a_solar_row_is_refused_naming_the_extra(
    database: str, settings: CelerySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_celery_beat.models import SolarSchedule

    solar = SolarSchedule.objects.create(event="sunrise", latitude=48.85, longitude=2.35)
    row = admin_row(name="dawn", solar=solar)
    monkeypatch.setitem(sys.modules, "ephem", None)  # as if it were not installed
    with pytest.raises(RowRefused, match=r"row 'dawn' \(id \d+\): .*the solar trigger") as caught:
        entry(row, settings)
    assert "pip install 'beatless[solar]'" in str(caught.value)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"args": "[1,"}, "args is not JSON"),
        ({"kwargs": "[1]"}, "kwargs must be a JSON dict"),
        ({"headers": "nope"}, "headers is not JSON"),
        ({"kind": "interval", "schedule": {"every": 1, "period": "fortnights"}}, "period"),
        ({"kind": None, "schedule": {}}, "sets no schedule"),
        ({"kind": None, "schedule": {"kinds": ["crontab", "interval"]}}, "exactly one"),
        ({"task": ""}, "task"),
    ],
)
def test_a_bad_row_is_refused_naming_the_row_and_the_reason(
    settings: CelerySettings, changes: dict[str, Any], reason: str
) -> None:
    fields: dict[str, Any] = {
        "id": 7,
        "name": "bad",
        "task": "proj.report",
        "kind": "interval",
        "schedule": {"every": 10, "period": "seconds"},
    }
    row = Row(**{**fields, **changes})
    with pytest.raises(RowRefused, match=r"django-celery-beat row 'bad' \(id 7\)") as caught:
        entry_of_row(row, settings, fence_ms=FENCE)
    assert reason in str(caught.value)


def test_the_digest_follows_the_definition_not_the_run_count(database: str) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    row = admin_row(name="counted", interval=every)
    before = row_of(row).digest()
    PeriodicTask.objects.filter(pk=row.pk).update(
        total_run_count=5, last_run_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    again = PeriodicTask.objects.select_related("interval").get(pk=row.pk)
    assert row_of(again).digest() == before
    again.args = "[2]"
    again.save()
    assert row_of(again).digest() != before
