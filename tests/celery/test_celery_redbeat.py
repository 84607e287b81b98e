"""RedBeat import: a real RedBeat schedule, written by ``RedBeatSchedulerEntry.save()`` and
RedBeat's own scheduler set-up on the local Redis (database 13, a prefix of the test's
own), read back as live entries whose occurrences are compared with RedBeat's own."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from celery_fixtures import REDIS_DB, REDIS_HOST, REDIS_PORT

from beatless.celery import import_redbeat
from beatless.cli.command import main
from beatless.core._time import from_datetime, to_datetime
from beatless.core.triggers import At, Cron, Every
from beatless.errors import ConfigError, StoreError
from beatless.live import Live
from beatless.stores import MemoryStore

redbeat = pytest.importorskip("redbeat")
from redbeat import RedBeatScheduler, RedBeatSchedulerEntry  # noqa: E402
from redbeat.schedules import rrule  # noqa: E402

SOURCE = f"redbeat://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}"
LAST_RUN = (2027, 3, 20, 9, 13, 7, 123000)
"""RedBeat's last_run_at of every entry: a week before Europe/Paris moves to summer time,
so the next 100 occurrences of most entries cross that change (beatless keeps 1 ms)."""

ENTRIES: dict[str, Any] = {
    "every-90s": schedule(timedelta(seconds=90)),
    "every-day": schedule(timedelta(days=1)),
    "every-2h-relative": schedule(timedelta(hours=2), relative=True),
    "weekdays": crontab(minute=30, hour="4,16", day_of_week="mon-fri"),
    "quarters-at-2": crontab(minute="*/15", hour=2),
    "friday-13th": crontab(minute=0, hour=0, day_of_month=13, day_of_week="fri"),
    "once": rrule("MINUTELY", dtstart=datetime(2030, 1, 1, 12, 0, tzinfo=UTC), count=1),
}


@pytest.fixture
def redbeat_app(prefix: str) -> Any:
    """A Celery app whose RedBeat writes under ``PREFIX:`` (the test's keys, deleted by the
    ``prefix`` fixture), with one static entry in its beat_schedule."""

    def make(zone: str) -> Celery:
        app = Celery(prefix)  # current: RedBeat's decoder reads crontabs in its zone
        app.conf.update(
            broker_url="memory://",
            beatless_store_url="memory://",
            redbeat_redis_url=f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}",
            redbeat_key_prefix=f"{prefix}:",
            timezone=zone,
            beat_schedule={"static-cleanup": {"task": "app.cleanup", "schedule": 300.0}},
        )
        return app

    return make


def write_redbeat(app: Celery, zone: str, entries: dict[str, Any] = ENTRIES) -> datetime:
    """RedBeat's own writes: its scheduler's set-up (the statics) and ``entry.save()``."""
    RedBeatScheduler(app=app, lazy=True).setup_schedule()
    last_run = datetime(*LAST_RUN, tzinfo=ZoneInfo(zone))
    for name, value in entries.items():
        RedBeatSchedulerEntry(
            name, f"app.{name}", value, args=[name], app=app, last_run_at=last_run
        ).save()
    RedBeatSchedulerEntry(
        "paused", "app.paused", crontab(minute=5), app=app, enabled=False, last_run_at=last_run
    ).save()
    return last_run


def redbeat_occurrences(app: Celery, name: str, count: int = 100) -> list[int]:
    """The next ``count`` runs as RedBeat decides them, each from the one before: the entry
    read by RedBeat (``from_key``), and each run the first millisecond at which its
    schedule's ``is_due(last_run_at)`` says due, as RedBeat's beat asks it; the run then
    becomes ``last_run_at``, in the app's zone, as the beat records it. The instant is
    found from ``remaining_estimate`` (added in UTC or on the wall clock: whichever
    ``is_due`` confirms is the first due millisecond)."""
    entry = RedBeatSchedulerEntry.from_key(app.redbeat_conf.key_prefix + name, app=app)
    value, last = entry.schedule, entry.last_run_at
    if isinstance(value, rrule):
        following = value.rrule.after(last)
        return [] if following is None else [from_datetime(following)]
    zone = ZoneInfo(str(app.conf.timezone))
    found: list[int] = []
    while len(found) < count:
        value.nowfun = lambda at=last: at
        rem = value.remaining_estimate(last)
        candidates = sorted({from_datetime(last + rem), from_datetime(last.astimezone(UTC) + rem)})
        run = next(
            c
            for c in candidates
            if _due(value, last, c, zone) and not _due(value, last, c - 1, zone)
        )
        found.append(run)
        last = to_datetime(run).astimezone(zone)
    return found


def _due(value: Any, last: datetime, ms: int, zone: ZoneInfo) -> bool:
    value.nowfun = lambda: to_datetime(ms).astimezone(zone)
    return bool(value.is_due(last)[0])


def celery_adds_intervals_on_the_wall_clock() -> bool:
    """Whether this Celery adds an interval on the wall clock across a change of UTC
    offset (5.3 does: a daily interval keeps its local time) rather than counting elapsed
    time, as later releases and beatless do."""
    zone = ZoneInfo("Europe/Paris")
    last = datetime(2027, 3, 27, 12, tzinfo=zone)
    noon_after = datetime(2027, 3, 28, 12, tzinfo=zone)  # 23 h later: summer time began
    return bool(schedule(timedelta(days=1), nowfun=lambda: noon_after).is_due(last)[0])


def beatless_occurrences(trigger: Any, after: datetime, count: int) -> list[int]:
    iterator = trigger.after(from_datetime(after))
    return [next(iterator) for _ in range(count)]


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
def test_an_imported_schedule_fires_as_redbeat_computes_it_for_100_occurrences(
    redbeat_app: Any, zone: str
) -> None:
    app = redbeat_app(zone)
    last_run = write_redbeat(app, zone)
    store = MemoryStore()

    done = import_redbeat(app, SOURCE, store=store)

    assert done.revision is not None
    assert done.read.statics == ("static-cleanup",)  # RedBeat's static, left to the code
    live = {e.name: e for e in Live(store, namespace=app.main).list()}
    assert sorted(live) == sorted([*ENTRIES, "paused"])
    assert live["paused"].enabled is False
    assert live["weekdays"].args == ("weekdays",)
    assert isinstance(live["weekdays"].trigger, Cron)
    assert live["weekdays"].trigger.tz == zone
    assert isinstance(live["every-90s"].trigger, Every)
    assert isinstance(live["once"].trigger, At)
    for name in ENTRIES:
        expected = redbeat_occurrences(app, name)
        got = beatless_occurrences(live[name].trigger, last_run, len(expected))
        crosses = isinstance(live[name].trigger, Every) and zone != "UTC"
        if crosses and celery_adds_intervals_on_the_wall_clock():
            # The same runs until summer time begins; from then on beatless's (a day of
            # elapsed time) are an hour after this Celery's, as docs/migrating-from-beat.md
            # says.
            shifts = [g - e for g, e in zip(got, expected, strict=True)]
            assert shifts == sorted(shifts), name
            assert set(shifts) <= {0, 3_600_000}, name
            continue
        assert got == expected, name
    assert len(redbeat_occurrences(app, "every-day")) == 100


def test_the_command_imports_once_and_a_dry_run_writes_nothing(
    redbeat_app: Any, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_redbeat(redbeat_app("UTC"), "UTC")
    fleet = ["--store", f"sqlite:///{tmp_path / 'claims.db'}", "--namespace", "moved"]
    source = ["--from", SOURCE, "--prefix", f"{prefix}:", "--timezone", "UTC"]

    def run(*args: str) -> dict[str, Any]:
        assert main(["schedule", "import", *source, *fleet, "--json", *args]) == 0
        found: dict[str, Any] = json.loads(capsys.readouterr().out)
        return found

    dry = run("--dry-run")
    assert dry["revision"] is None
    assert main(["schedule", "list", *fleet, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["revision"] == 0  # nothing written
    assert sorted(c["name"] for c in dry["plan"]["changes"]) == sorted([*ENTRIES, "paused"])

    first = run()
    again = run()

    assert first["revision"]["number"] == 1
    assert first["statics"] == ["static-cleanup"]  # from RedBeat's statics set alone
    assert again["revision"] is None
    assert again["plan"]["changes"] == []  # the same entries: no second revision
    assert main(["schedule", "import", *source, *fleet, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "left to the code (statics, code-owned): static-cleanup" in text
    assert "no change (r1)" in text


def test_an_import_beside_other_live_entries_leaves_them(
    redbeat_app: Any, prefix: str, tmp_path: Path
) -> None:
    app = redbeat_app("UTC")
    RedBeatSchedulerEntry("nightly", "app.nightly", crontab(hour=2, minute=0), app=app).save()
    store = MemoryStore()
    Live(store, namespace=app.main).put(_entry("kept"))

    import_redbeat(app, SOURCE, store=store)

    assert [e.name for e in Live(store, namespace=app.main).list()] == ["kept", "nightly"]


def _entry(name: str) -> Any:
    from beatless.schedule.entry import Entry

    return Entry(name=name, task="app.kept", trigger=Cron("0 3 * * *", "UTC"))


def test_a_bad_entry_refuses_the_import_naming_it_unless_skip_bad(
    redbeat_app: Any, prefix: str, redis_client: Any, tmp_path: Path
) -> None:
    app = redbeat_app("UTC")
    RedBeatSchedulerEntry("good", "app.good", crontab(hour=2, minute=0), app=app).save()
    RedBeatSchedulerEntry(
        "weekly", "app.weekly", rrule("WEEKLY", dtstart=datetime(2030, 1, 1, tzinfo=UTC)), app=app
    ).save()
    RedBeatSchedulerEntry(
        "midnights", "app.m", schedule(timedelta(days=1), relative=True), app=app
    ).save()
    redis_client.hset(f"{prefix}:broken", "definition", "{not json")
    redis_client.zadd(f"{prefix}::schedule", {f"{prefix}:broken": 0})
    store = MemoryStore()

    with pytest.raises(ConfigError) as refused:
        import_redbeat(app, SOURCE, store=store)
    done = import_redbeat(app, SOURCE, store=store, skip_bad=True)

    assert "entry 'broken'" in str(refused.value)
    assert "entry 'weekly': an rrule with no count repeats" in str(refused.value)
    assert "entry 'midnights': Celery runs a relative interval" in str(refused.value)
    assert "nothing written" in str(refused.value)
    assert [e.name for e in Live(store, namespace=app.main).list()] == ["good"]
    assert [name for name, _why in done.read.skipped] == ["broken", "midnights", "weekly"]


def test_a_past_one_off_is_skipped_and_said(redbeat_app: Any) -> None:
    app = redbeat_app("UTC")
    when = datetime(2020, 1, 1, 12, 0, tzinfo=UTC)
    RedBeatSchedulerEntry(
        "done", "app.done", rrule("MINUTELY", dtstart=when, count=1), app=app
    ).save()
    RedBeatSchedulerEntry("good", "app.good", crontab(hour=2, minute=0), app=app).save()

    done = import_redbeat(app, SOURCE, store=MemoryStore())

    assert [e.name for e in done.read.entries] == ["good"]
    (skipped,) = done.read.skipped
    assert skipped[0] == "done"
    assert "a one-off at 2020-01-01T12:00:00.000Z, already past" in skipped[1]


def test_clear_errors_for_no_entries_no_redis_no_zone_and_no_source(
    redbeat_app: Any, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = redbeat_app("UTC")
    RedBeatSchedulerEntry("nightly", "app.nightly", crontab(hour=2, minute=0), app=app).save()
    fleet = ["--store", f"sqlite:///{tmp_path / 'claims.db'}", "--namespace", "moved"]

    def error(*args: str) -> str:
        assert main(["schedule", "import", *fleet, *args]) == 2
        return capsys.readouterr().err

    assert f"no RedBeat entries under prefix '{prefix}-other:'" in error(
        "--from", SOURCE, "--prefix", f"{prefix}-other:"
    )
    assert "cannot be read" in error("--from", "redbeat://127.0.0.1:1/0", "--prefix", "x:")
    assert "give --celery APP or --timezone ZONE" in error(
        "--from", SOURCE, "--prefix", f"{prefix}:"
    )
    assert "give --from redbeat://HOST:PORT/DB" in error()
    assert "give redbeat://HOST:PORT/DB" in error("--from", "http://example.org/")
    with pytest.raises(StoreError, match="cannot be read"):
        import_redbeat(app, "redbeat://127.0.0.1:1/0", store=MemoryStore())


def test_the_command_with_a_celery_app_takes_its_zone_prefix_and_code_names(
    redbeat_app: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_redbeat(redbeat_app("Europe/Paris"), "Europe/Paris")
    module = f"rbapp_{prefix.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery({prefix!r})\n"
        "app.conf.update(\n"
        f"    broker_url='memory://', beatless_store_url='sqlite:///{tmp_path}/c.db',\n"
        f"    timezone='Europe/Paris', redbeat_key_prefix='{prefix}:',\n"
        "    beat_schedule={'weekdays': {'task': 'app.weekdays', 'schedule': 60.0}},\n"
        ")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert (
        main(["schedule", "import", "--from", SOURCE, "--celery", f"{module}:app", "--json"]) == 0
    )
    done = json.loads(capsys.readouterr().out)
    assert main(["schedule", "get", "quarters-at-2", "--celery", f"{module}:app", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)

    assert done["prefix"] == f"{prefix}:"  # the app's redbeat_key_prefix
    assert done["statics"] == ["static-cleanup", "weekdays"]  # RedBeat's, and the app's code
    assert entry["trigger"]["timezone"] == "Europe/Paris"


def test_without_celery_redbeat_the_import_names_the_extra(
    redbeat_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = redbeat_app("UTC")
    monkeypatch.setitem(sys.modules, "redbeat", None)  # as in a venv without it
    monkeypatch.setitem(sys.modules, "redbeat.decoder", None)

    with pytest.raises(ConfigError, match=r"pip install 'beatless\[redbeat\]'"):
        import_redbeat(app, SOURCE, store=MemoryStore())
