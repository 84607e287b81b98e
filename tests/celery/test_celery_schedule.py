"""Reading ``beat_schedule`` and the beatless settings of a real Celery app."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.beat import Scheduler as StockScheduler
from celery.schedules import crontab, schedule
from kombu import Queue

from beatless.celery import (
    CelerySettings,
    check_app,
    occurrence,
    read_schedule,
    task_firing_id,
    tenant,
)
from beatless.celery._messages import OCCURRENCE_HEADER
from beatless.core.triggers import Cron, Every
from beatless.errors import ConfigError, ScheduleError
from beatless.schedule.firing import EPOCH, from_datetime, iso
from beatless.stores import open_store

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def make_app(schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
    app = Celery("proj", broker=conf.pop("broker", "redis://127.0.0.1:6379/13"))
    app.conf.update(beat_schedule=schedule or {}, **conf)
    return app


def entry(name: str, value: Any, **spec: Any) -> dict[str, Any]:
    return {name: {"task": "proj.tasks.work", "schedule": value, **spec}}


def occurrences(trigger: Any, start: datetime, count: int) -> list[datetime]:
    found = itertools.islice(trigger.after(from_datetime(start)), count)
    return [EPOCH + timedelta(milliseconds=ms) for ms in found]


# -- triggers -------------------------------------------------------------------------


def test_crontab_becomes_a_cron_in_the_app_timezone() -> None:
    app = make_app(entry("nightly", crontab(minute=30, hour=2)), timezone="Europe/Berlin")
    (read,) = read_schedule(app).entries
    assert read.trigger == Cron("30 2 * * *", "Europe/Berlin", day_and=True)


def test_crontab_is_in_utc_when_the_app_names_no_timezone() -> None:
    (read,) = read_schedule(make_app(entry("e", crontab(minute="*/15")))).entries
    assert read.trigger == Cron("0,15,30,45 * * * *", "UTC", day_and=True)


def test_crontab_without_enable_utc_or_timezone_asks_for_a_timezone() -> None:
    app = make_app(entry("e", crontab()), enable_utc=False)
    with pytest.raises(ConfigError, match=r"set app\.conf\.timezone"):
        read_schedule(app)


def test_crontab_keeps_the_zone_of_its_own_nowfun() -> None:
    tokyo = crontab(minute=0, hour=9, nowfun=lambda: datetime.now(ZoneInfo("Asia/Tokyo")))
    app = make_app(entry("e", tokyo), timezone="Europe/Berlin")
    (read,) = read_schedule(app).entries
    assert read.trigger.tz == "Asia/Tokyo"


def test_crontab_needs_day_of_month_and_day_of_week_as_celery_does() -> None:
    friday_13 = crontab(0, 0, day_of_month="13", day_of_week="fri")
    app = make_app(entry("friday13", friday_13), timezone="Europe/Berlin")
    (read,) = read_schedule(app).entries
    expected = [
        datetime(d.year, d.month, d.day, tzinfo=ZoneInfo("Europe/Berlin"))
        for d in (date(2024, 1, 1) + timedelta(days=n) for n in range(6 * 366))
        if d.day == 13 and d.weekday() == 4
    ][:8]
    got = occurrences(read.trigger, datetime(2024, 1, 1, tzinfo=UTC), 8)
    assert got == expected
    assert [g.astimezone(ZoneInfo("Europe/Berlin")).strftime("%a %d") for g in got] == [
        "Fri 13"
    ] * 8


@pytest.mark.parametrize(
    "spec",
    [
        {"minute": "*/15"},
        {"minute": "30", "hour": "1,3", "day_of_week": "sun"},
        {"minute": "0", "hour": "*/6", "day_of_week": "mon-fri"},
        {"minute": "5", "hour": "4", "day_of_month": "1-7", "day_of_week": "mon"},
        {"minute": "0", "hour": "12", "day_of_month": "15", "month_of_year": "5,7"},
    ],
)
def test_crontab_occurrences_match_celery_own_evaluator(spec: dict[str, str]) -> None:
    zone = ZoneInfo("Europe/Berlin")
    app = make_app(entry("e", crontab(**spec)), timezone="Europe/Berlin")
    (read,) = read_schedule(app).entries
    # April to September 2026 in Berlin: no DST transition, where Celery's wall-clock
    # arithmetic is exact.
    start = datetime(2026, 4, 1, tzinfo=zone)
    end = datetime(2026, 10, 1, tzinfo=zone)
    got = [o for o in occurrences(read.trigger, start, 40) if o < end]
    expected, last = [], start
    celery_cron = crontab(**spec, app=app)
    while len(expected) < len(got):
        celery_cron.nowfun = lambda last=last: last
        last = last + celery_cron.remaining_estimate(last)
        expected.append(last)
    assert got == expected
    assert got


def test_numbers_timedeltas_and_schedules_become_every_anchored_to_the_epoch() -> None:
    app = make_app(
        {
            **entry("number", 30),
            **entry("float", 0.5),
            **entry("timedelta", timedelta(minutes=2)),
            **entry("schedule", schedule(timedelta(hours=1))),
            **entry("schedule-number", schedule(10)),
        }
    )
    triggers = {e.name: e.trigger for e in read_schedule(app).entries}
    assert triggers == {
        "number": Every(30),
        "float": Every(timedelta(milliseconds=500)),
        "timedelta": Every(120),
        "schedule": Every(3600),
        "schedule-number": Every(10),
    }
    assert all(t.anchor == EPOCH for t in triggers.values())  # type: ignore[attr-defined]


def test_an_unknown_schedule_type_is_refused_naming_the_entry() -> None:
    app = make_app(entry("odd", "every day"))
    with pytest.raises(ScheduleError, match=r"entry 'odd': unsupported schedule 'every day'"):
        read_schedule(app)


def test_an_entry_without_a_task_is_refused() -> None:
    app = make_app({"no-task": {"schedule": 10}})
    with pytest.raises(ConfigError, match="task must be a non-empty string"):
        read_schedule(app)


# -- entries and their beatless settings ---------------------------------------------


def test_args_kwargs_and_options_are_read_without_the_beatless_settings() -> None:
    app = make_app(
        entry(
            "report",
            60,
            args=(1, "a"),
            kwargs={"full": True},
            options={"queue": "reports", "priority": 3, "beatless": {"jitter": "10s"}},
        )
    )
    (read,) = read_schedule(app).entries
    assert (read.task, read.args, dict(read.kwargs)) == (
        "proj.tasks.work",
        (1, "a"),
        {"full": True},
    )
    assert dict(read.options) == {"queue": "reports", "priority": 3}
    assert read.jitter == timedelta(seconds=10)


def test_entry_settings_override_the_app_defaults() -> None:
    def tenants() -> list[str]:
        return ["acme", "globex"]

    app = make_app(
        {
            **entry("plain", 600),
            **entry("fanout", 600, options={"beatless": {"max_late": "2m", "tenants": tenants}}),
            **entry("listed", 600, options={"beatless": {"tenants": ["a", "b"], "jitter": 0}}),
        },
        beatless_jitter=30,
        beatless_max_late="PT90S",
    )
    by_name = {e.name: e for e in read_schedule(app).entries}
    assert (by_name["plain"].jitter, by_name["plain"].max_late) == (
        timedelta(seconds=30),
        timedelta(seconds=90),
    )
    assert by_name["fanout"].max_late == timedelta(minutes=2)
    assert by_name["fanout"].tenant_list() == ("acme", "globex")
    assert by_name["listed"].tenants == ("a", "b")
    assert by_name["listed"].jitter == timedelta(0)


def tenants_of_the_test() -> list[str]:
    return ["north", "south"]


def test_tenants_may_be_named_by_import_path_so_stock_beat_can_serialise_them() -> None:
    path = f"{__name__}:tenants_of_the_test"
    app = make_app(entry("fanout", 600, options={"beatless": {"tenants": path}}))
    (read,) = read_schedule(app).entries
    assert read.tenant_list() == ("north", "south")
    bad = make_app(entry("fanout", 600, options={"beatless": {"tenants": "no.such:thing"}}))
    with pytest.raises(ConfigError, match=r"entry 'fanout': tenants 'no\.such:thing'"):
        read_schedule(bad)


def test_an_unknown_beatless_key_is_refused_listing_the_allowed_keys() -> None:
    app = make_app(entry("e", 60, options={"beatless": {"jiter": 5}}))
    with pytest.raises(ConfigError, match=r"unknown beatless setting.*'jiter'.*jitter, max_late"):
        read_schedule(app)


def test_namespace_per_entry_is_refused_pointing_at_the_app_setting() -> None:
    app = make_app(entry("e", 60, options={"beatless": {"namespace": "x"}}))
    with pytest.raises(ConfigError, match="beatless_namespace"):
        read_schedule(app)


def test_unsafe_timings_fail_when_the_schedule_is_read() -> None:
    app = make_app(entry("tight", 10, options={"beatless": {"jitter": 8}}))
    with pytest.raises(ScheduleError, match="entry 'tight': jitter 8s must be under half"):
        read_schedule(app)


# -- every problem at once --------------------------------------------------------------


class Opaque:
    """An argument no JSON encoder takes."""


def test_check_app_reports_every_problem_at_once_each_naming_its_entry() -> None:
    app = make_app(
        {
            **entry("fine", 60),
            **entry("odd-trigger", "every day"),
            **entry("typo", 60, options={"beatless": {"jiter": 5}}),
            **entry("tight", 10, options={"beatless": {"jitter": 8}}),
            **entry("late", 60, options={"beatless": {"jitter": 20, "max_late": 10}}),
            **entry("opaque", 60, args=[1, Opaque()], kwargs={"when": Opaque(), "n": 2}),
            "no-task": {"schedule": 60},
        }
    )
    found = check_app(app)
    assert found.schedule is None
    named = {problem.split("'")[1] for problem in found.problems}
    assert named == {"odd-trigger", "typo", "tight", "late", "opaque", "no-task"}
    assert len(found.problems) == 7  # two arguments of 'opaque'
    opaque = [p for p in found.problems if p.startswith("entry 'opaque'")]
    assert any("args[1] (a Opaque) cannot be encoded as JSON" in p for p in opaque)
    assert any("kwargs['when'] (a Opaque)" in p for p in opaque)
    with pytest.raises(ScheduleError) as caught:
        read_schedule(app)
    assert caught.value.errors == list(found.problems)


def test_check_app_is_sound_and_gives_the_schedule_when_nothing_is_wrong() -> None:
    found = check_app(make_app({**entry("a", 60), **entry("b", crontab(minute=0))}))
    assert found.is_sound
    assert found.problems == ()
    assert found.schedule is not None
    assert [e.name for e in found.schedule.entries] == ["a", "b"]


def test_arguments_are_checked_only_where_the_serializer_is_json() -> None:
    pickled = entry("pickled", 60, args=[Opaque()], options={"serializer": "pickle"})
    assert check_app(make_app(pickled)).is_sound
    assert check_app(make_app(entry("all", 60, args=[Opaque()]), task_serializer="pickle")).is_sound
    dates = entry("dates", 60, args=[date(2026, 1, 1)], kwargs={"at": datetime.now(UTC)})
    assert check_app(make_app(dates)).is_sound  # kombu's JSON takes dates


def test_settings_report_every_bad_setting_at_once() -> None:
    app = make_app(
        beatless_max_late="soon",
        beatless_jitter="wide",
        beatless_force_two_phase="yes",
        beatless_on_schedule_error="ignore",
        timezone="Europe/Berln",
    )
    with pytest.raises(ScheduleError) as caught:
        CelerySettings.from_app(app)
    assert [e.split(":")[0].split(" ")[0] for e in caught.value.errors] == [
        "Celery",
        "beatless_jitter",
        "beatless_max_late",
        "beatless_force_two_phase",
        "beatless_on_schedule_error",
    ]
    assert check_app(app).problems == tuple(caught.value.errors)


def test_on_schedule_error_is_refuse_by_default_or_consume() -> None:
    assert CelerySettings.from_app(make_app()).on_schedule_error == "refuse"
    consume = make_app(beatless_on_schedule_error="consume")
    assert CelerySettings.from_app(consume).on_schedule_error == "consume"


def test_unregistered_tasks_are_warnings_since_another_worker_may_run_them() -> None:
    from beatless.celery._schedule import unregistered_tasks

    app = make_app({**entry("known", 60), **entry("elsewhere", 60, task="other.work")})

    @app.task(name="proj.tasks.work")
    def work() -> None: ...

    schedule = read_schedule(app)
    (warning,) = unregistered_tasks(app, schedule)
    assert warning.startswith("entry 'elsewhere': task 'other.work' is not registered")


# -- time zones given as objects --------------------------------------------------------


def test_a_pytz_timezone_is_read_as_its_iana_name() -> None:
    pytz = pytest.importorskip("pytz")
    app = make_app(entry("e", crontab(minute=0, hour=2)), timezone=pytz.timezone("Europe/Berlin"))
    assert CelerySettings.from_app(app).timezone == "Europe/Berlin"
    (read,) = read_schedule(app).entries
    assert read.trigger == Cron("0 2 * * *", "Europe/Berlin", day_and=True)
    assert CelerySettings.from_app(make_app(timezone=pytz.utc)).timezone == "UTC"


def test_a_crontab_nowfun_in_a_pytz_zone_keeps_that_zone() -> None:
    pytz = pytest.importorskip("pytz")
    tokyo = pytz.timezone("Asia/Tokyo")
    app = make_app(entry("e", crontab(minute=0, hour=9, nowfun=lambda: datetime.now(tokyo))))
    (read,) = read_schedule(app).entries
    assert read.trigger.tz == "Asia/Tokyo"


@pytest.mark.parametrize(
    ("given", "name"),
    [
        (ZoneInfo("America/New_York"), "America/New_York"),
        (UTC, "UTC"),
        (timezone(timedelta(0)), "UTC"),
        ("Asia/Kolkata", "Asia/Kolkata"),
    ],
)
def test_zone_objects_with_a_name_every_node_reads_alike_are_accepted(
    given: Any, name: str
) -> None:
    assert CelerySettings.from_app(make_app(timezone=given)).timezone == name


def test_dateutil_zones_from_the_tz_database_are_accepted() -> None:
    from dateutil import tz

    berlin = tz.gettz("Europe/Berlin")
    assert CelerySettings.from_app(make_app(timezone=berlin)).timezone == "Europe/Berlin"
    assert CelerySettings.from_app(make_app(timezone=tz.tzutc())).timezone == "UTC"


@pytest.mark.parametrize(
    "given",
    [timezone(timedelta(hours=1)), "local", "Europe/Berln"],
    ids=["fixed-offset", "host-local", "unknown-name"],
)
def test_a_zone_without_a_name_every_node_agrees_on_is_refused_naming_the_setting(
    given: Any,
) -> None:
    if given == "local":
        from dateutil import tz

        given = tz.tzlocal()
    with pytest.raises(ConfigError, match="Celery timezone"):
        CelerySettings.from_app(make_app(timezone=given))


def test_a_crontab_nowfun_in_a_fixed_offset_is_refused_naming_the_entry() -> None:
    plus_one = timezone(timedelta(hours=1))
    app = make_app(entry("offset", crontab(minute=0, nowfun=lambda: datetime.now(plus_one))))
    with pytest.raises(ScheduleError, match="entry 'offset': the crontab's nowfun returns"):
        read_schedule(app)


# -- settings -------------------------------------------------------------------------


def test_settings_defaults_follow_the_app_and_a_redis_broker() -> None:
    settings = CelerySettings.from_app(make_app())
    assert settings.store_url == "redis://127.0.0.1:6379/13"
    assert settings.namespace == "proj"
    assert settings.timezone == "UTC"
    assert settings.max_late is None  # unset: each entry takes its trigger's default
    assert settings.jitter == timedelta(0)
    assert settings.lease == timedelta(seconds=30)
    assert (settings.force_two_phase, settings.expires_from_lateness) == (False, False)
    assert settings.atomic


def test_an_app_without_a_main_name_must_name_its_namespace_unless_its_store_is_memory() -> None:
    for main in (None, "__main__"):
        app = Celery(main, broker="redis://localhost/0", set_as_current=False)
        with pytest.raises(ConfigError, match="beatless_namespace is required"):
            CelerySettings.from_app(app)
        app.conf.beatless_namespace = "billing"
        assert CelerySettings.from_app(app).namespace == "billing"
    alone = Celery(broker="memory://", set_as_current=False)
    alone.conf.beatless_store_url = "memory://"
    assert CelerySettings.from_app(alone).namespace == "celery"


def test_store_url_is_required_with_a_broker_that_is_neither_redis_nor_rabbitmq() -> None:
    app = make_app(broker="sqla+postgresql://user:secret@db/celery")
    with pytest.raises(ConfigError, match="beatless_store_url is required") as caught:
        CelerySettings.from_app(app)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("broker", "store"),
    [
        ("amqp://guest:secret@rabbit:5672//", "amqp://guest:secret@rabbit:5672/%2F"),
        ("pyamqp://app@rabbit/vh", "amqp://app:guest@rabbit:5672/vh"),
        ("amqps://app:pw@rabbit:5671/", "amqps://app:pw@rabbit:5671/%2F"),
    ],
)
def test_a_rabbitmq_broker_is_its_own_claim_store_by_default(broker: str, store: str) -> None:
    settings = CelerySettings.from_app(make_app(broker=broker))
    assert settings.store_url == store
    assert settings.two_phase_reason == "the broker is not Redis"


@pytest.mark.parametrize(
    ("broker", "options", "store"),
    [
        (
            "sentinel://:m%40ster@s1:26379/2;sentinel://s2/2",
            {"master_name": "orders", "sentinel_kwargs": {"password": "s&nt"}},
            "redis+sentinel://:m%40ster@s1:26379,s2/orders/2?sentinel_password=s%26nt",
        ),
        (
            ["sentinel://s1:26380", "sentinel://s2:26381"],
            {"master_name": "my orders"},
            "redis+sentinel://s1:26380,s2:26381/my%20orders/0",
        ),
    ],
)
def test_a_sentinel_broker_gives_the_sentinel_store_of_its_master(
    broker: Any, options: dict[str, Any], store: str
) -> None:
    settings = CelerySettings.from_app(make_app(broker=broker, broker_transport_options=options))
    assert settings.store_url == store
    assert settings.two_phase_reason is not None
    assert settings.two_phase_reason.startswith("the broker is Redis Sentinel")
    assert "m@ster" not in repr(settings)
    assert "s&nt" not in repr(settings)
    opened = open_store(settings.store_url, namespace=settings.namespace)
    pool = opened.client.connection_pool  # type: ignore[attr-defined]
    assert pool.service_name == options["master_name"]
    assert pool.sentinel_manager.sentinel_kwargs.get("password") == options.get(
        "sentinel_kwargs", {}
    ).get("password")
    opened.close()


def test_a_sentinel_broker_without_its_master_name_says_what_to_set() -> None:
    app = make_app(broker="sentinel://:secret@s1:26379/0")
    with pytest.raises(ConfigError, match="transport_options has no 'master_name'") as caught:
        CelerySettings.from_app(app)
    assert "beatless_store_url to 'redis+sentinel://host:26379" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_a_store_beside_another_broker_is_two_phase() -> None:
    app = make_app(broker="amqp://rabbit//", beatless_store_url="redis://127.0.0.1:6379/2")
    settings = CelerySettings.from_app(app)
    assert (settings.store_is_broker, settings.atomic) == (False, False)


@pytest.mark.parametrize(
    ("broker", "store", "same"),
    [
        ("redis://localhost:6379/0", "redis://127.0.0.1/0", True),
        ("redis://:pw@127.0.0.1:6379", "redis://127.0.0.1:6379/0", True),
        ("redis://127.0.0.1:6379/1", "redis://127.0.0.1:6379/2", False),
        ("redis://127.0.0.1:6379/1", "redis://127.0.0.1:6380/1", False),
        ("rediss://h:6379/0", "redis://h:6379/0", False),
        ("redis+socket:///run/redis.sock?virtual_host=3", "unix:///run/redis.sock?db=3", True),
        ("redis://127.0.0.1:6379/0", "sqlite:///beats.db", False),
    ],
)
def test_store_is_the_broker_when_normalised_urls_match(
    broker: str, store: str, same: bool
) -> None:
    app = make_app(broker=broker, beatless_store_url=store)
    assert CelerySettings.from_app(app).store_is_broker is same


def test_force_two_phase_turns_the_atomic_path_off() -> None:
    settings = CelerySettings.from_app(make_app(beatless_force_two_phase=True))
    assert (settings.store_is_broker, settings.atomic) == (True, False)


def test_settings_refuse_a_bad_duration_and_a_non_boolean_flag() -> None:
    with pytest.raises(ConfigError, match="beatless_max_late"):
        CelerySettings.from_app(make_app(beatless_max_late="soon"))
    with pytest.raises(ConfigError, match="beatless_force_two_phase must be True or False"):
        CelerySettings.from_app(make_app(beatless_force_two_phase="yes"))


def test_settings_repr_masks_passwords() -> None:
    app = make_app(broker="redis://:hunter2@127.0.0.1:6379/0")
    assert "hunter2" not in repr(CelerySettings.from_app(app))


# -- the task side --------------------------------------------------------------------


def test_occurrence_and_task_firing_id_are_read_from_an_eager_request() -> None:
    app = Celery("proj", set_as_current=False)
    seen: dict[str, Any] = {}

    @app.task(bind=True)
    def work(self: Any) -> None:
        seen.update(
            occurrence=occurrence(self.request),
            firing_id=task_firing_id(self.request),
            tenant=tenant(self.request),
        )

    headers = {OCCURRENCE_HEADER: iso(1_700_000_000_000), "beatless_address": "proj/e/acme"}
    work.apply(task_id="f-1", headers=headers)
    assert seen == {
        "occurrence": datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
        "firing_id": "f-1",
        "tenant": "acme",
    }
    work.apply(task_id="f-2")
    assert seen == {"occurrence": None, "firing_id": None, "tenant": None}


# -- rolling back to stock beat ---------------------------------------------------------


@pytest.mark.parametrize("broker", ["memory://", AMQP_URL])
def test_stock_celery_beat_loads_and_sends_a_schedule_carrying_beatless_options(
    broker: str, require: Any
) -> None:
    if broker.startswith("amqp"):
        require("RabbitMQ", "127.0.0.1", 5672)
    queue = f"bltest-stock-beat-{time.monotonic_ns()}"
    app = make_app(
        entry(
            "heartbeat",
            0.2,
            options={"queue": queue, "beatless": {"jitter": 0.05, "max_late": 5}},
        ),
        broker=broker,
    )
    stock = StockScheduler(app=app, lazy=False)
    try:
        deadline = time.monotonic() + 3
        sent = 0
        while time.monotonic() < deadline and sent < 2:
            if stock.tick() == 0:
                sent += 1
            time.sleep(0.05)
        assert sent >= 1
        with app.connection_for_read() as connection:
            simple = connection.SimpleQueue(Queue(queue))
            try:
                message = simple.get(timeout=2)
                assert message.headers["task"] == "proj.tasks.work"
                message.ack()
            finally:
                simple.close()
                Queue(queue).bind(connection.default_channel).delete()
    finally:
        stock.close()


def test_catch_up_comes_from_the_app_setting_or_the_entry_and_is_checked() -> None:
    app = make_app(
        {**entry("plain", 600), **entry("own", 600, options={"beatless": {"catch_up": "none"}})},
        beatless_catch_up="all",
    )
    by_name = {e.name: e.catch_up for e in read_schedule(app).entries}
    assert by_name == {"plain": "all", "own": "none"}
    assert {e.catch_up for e in read_schedule(make_app(entry("d", 600))).entries} == {"latest"}
    with pytest.raises(ConfigError, match="beatless_catch_up must be one of"):
        CelerySettings.from_app(make_app(entry("d", 600), beatless_catch_up="some"))


def test_the_preferred_claimer_is_on_by_default_and_a_setting_turns_it_off() -> None:
    assert CelerySettings.from_app(make_app()).preferred_claimer is True
    off = CelerySettings.from_app(make_app(beatless_preferred_claimer=False))
    assert off.preferred_claimer is False
    with pytest.raises(ScheduleError, match="beatless_preferred_claimer must be True or False"):
        CelerySettings.from_app(make_app(beatless_preferred_claimer="no"))
