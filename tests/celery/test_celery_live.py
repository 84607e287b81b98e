"""``beatless.celery.live(app)``: live entries in the shape of a ``beat_schedule`` item.

Real Celery apps; the claim store is the one the app decides (``beatless_store_url``, or
the broker's own Redis, database 13 under a namespace of the test's own), or a memory
store given."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from celery_fixtures import REDIS_HOST, REDIS_PORT, REDIS_URL
from service_check import require_service
from stores import delete_redis_prefix

import beatless.celery
from beatless.celery._schedule import read_entry
from beatless.celery._settings import CelerySettings
from beatless.core.triggers import Cron, Every
from beatless.errors import ConfigError, ScheduleError
from beatless.live import Live, entry_to_json
from beatless.schedule.entry import Entry
from beatless.stores import MemoryStore
from beatless.stores.sqlite import SQLiteStore

BEAT_SCHEDULE = {
    "cleanup": {"task": "app.cleanup", "schedule": 300.0},
}


def app_with(**conf: object) -> Celery:
    app = Celery(f"live{uuid.uuid4().hex[:8]}")
    app.conf.update(beat_schedule=BEAT_SCHEDULE, timezone="Europe/Paris", **conf)
    return app


@pytest.fixture(params=["memory", "sqlite", "redis"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Celery]:
    """An app on each store: the memory store is given to live(); SQLite is
    ``beatless_store_url``; Redis is the broker's own (no beatless_store_url)."""
    if request.param == "memory":
        yield app_with(broker_url="memory://", beatless_store_url="memory://")
    elif request.param == "sqlite":
        yield app_with(broker_url="memory://", beatless_store_url=f"sqlite:///{tmp_path}/c.db")
    else:
        require_service("Redis", REDIS_HOST, REDIS_PORT)
        found = app_with(broker_url=REDIS_URL)
        yield found
        delete_redis_prefix(f"beatless:{found.main}:")


@pytest.fixture
def store(app: Celery) -> MemoryStore | None:
    """The memory store shared by the test's writers (one process), else ``None``."""
    return MemoryStore() if app.conf.get("beatless_store_url") == "memory://" else None


def test_a_beat_schedule_item_is_read_as_a_node_reads_it(
    app: Celery, store: MemoryStore | None
) -> None:
    item = {
        "task": "app.report",
        "schedule": crontab(hour=4, minute=30),
        "args": (1,),
        "kwargs": {"to": "ops"},
        "options": {"queue": "slow", "beatless": {"jitter": "2m", "max_late": "5m"}},
    }
    with beatless.celery.live(app, store=store, writer="alice") as live:
        revision = live.put("report", item, note="ported from RedBeat")
        reader = Live(live.store, namespace=live.namespace)
        got = reader.get("report")

    expected = read_entry("report", item, CelerySettings.from_app(app))
    assert revision.number == 1
    assert revision.writer == "alice"
    assert got is not None
    assert entry_to_json(got) == entry_to_json(expected)
    assert got.trigger == Cron("30 4 * * *", "Europe/Paris", day_and=True)  # the app's zone
    assert got.jitter == timedelta(minutes=2)
    assert got.options == {"queue": "slow"}


def test_the_store_and_namespace_are_the_apps(app: Celery, store: MemoryStore | None) -> None:
    settings = CelerySettings.from_app(app)
    with beatless.celery.live(app, store=store) as live:
        assert live.namespace == settings.namespace == app.main
        assert live.timezone == "Europe/Paris"
        if store is None:
            assert live.store.name == settings.store_url.partition(":")[0]


def test_every_schedule_shape_ports_and_put_many_takes_a_beat_schedule_dict(
    app: Celery, store: MemoryStore | None
) -> None:
    items = {
        "seconds": {"task": "app.a", "schedule": 30},
        "delta": {"task": "app.b", "schedule": timedelta(minutes=5)},
        "interval": {"task": "app.c", "schedule": schedule(timedelta(hours=1))},
        "friday13": {
            "task": "app.d",
            "schedule": crontab(0, 0, day_of_month="13", day_of_week="fri"),
        },
    }
    with beatless.celery.live(app, store=store) as live:
        revision = live.put_many(items)
        entries = {e.name: e for e in live.list()}

    assert revision.names == ("seconds", "delta", "interval", "friday13")
    assert entries["seconds"].trigger == Every(30)
    assert entries["delta"].trigger == Every("5m")
    assert entries["interval"].trigger == Every("1h")
    assert entries["friday13"].trigger == Cron("0 0 13 * 5", "Europe/Paris", day_and=True)


def test_a_name_of_the_apps_beat_schedule_is_refused_unless_overridden(
    app: Celery, store: MemoryStore | None
) -> None:
    item = {"task": "app.cleanup", "schedule": 60}
    with beatless.celery.live(app, store=store) as live:
        with pytest.raises(ScheduleError, match="'cleanup' is owned by the code schedule"):
            live.put("cleanup", item)
        revision = live.put("cleanup", item, override=True)
    assert revision.changes[0].override


def test_a_bad_item_is_refused_naming_the_entry_and_an_entry_is_taken_as_it_is(
    app: Celery, store: MemoryStore | None
) -> None:
    with beatless.celery.live(app, store=store) as live:
        with pytest.raises(ScheduleError, match=r"entry 'bad'.*unsupported schedule"):
            live.put("bad", {"task": "app.x", "schedule": "every day"})
        with pytest.raises(ConfigError, match="unknown beatless setting"):
            live.put(
                "bad", {"task": "app.x", "schedule": 60, "options": {"beatless": {"jiter": 1}}}
            )
        entry = Entry(name="plain", task="app.plain", trigger=Every("1m"))
        assert live.put(entry).names == ("plain",)
        assert live.head() == 1


def test_a_plan_takes_a_beat_schedule_dict(app: Celery, store: MemoryStore | None) -> None:
    with beatless.celery.live(app, store=store) as live:
        plan = live.plan({"report": {"task": "app.report", "schedule": crontab(0, 4)}}, "2d")
    assert [c.name for c in plan.changes] == ["report"]
    assert len(plan.added) == 2


def test_a_store_given_is_left_open_and_one_opened_is_closed(tmp_path: Path) -> None:
    app = app_with(broker_url="memory://", beatless_store_url=f"sqlite:///{tmp_path}/c.db")
    given = SQLiteStore(tmp_path / "given.db")
    with beatless.celery.live(app, store=given) as live:
        live.put("x", {"task": "app.x", "schedule": 60})
    assert Live(given, namespace=app.main).head() == 1  # still open
    given.close()
