"""The bridge's change detection and publishing, on SQLite and PostgreSQL rows and a
claim store's live entries."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from django_project import AfterRead

from beatless.celery._settings import CelerySettings
from beatless.core.solar import Solar
from beatless.core.triggers import Cron, Every
from beatless.django import Bridge, DjangoRows
from beatless.errors import ScheduleError
from beatless.live import Live
from beatless.schedule.entry import Entry
from beatless.stores.memory import MemoryStore


@pytest.fixture
def settings() -> CelerySettings:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(beatless_store_url="memory://")
    return CelerySettings.from_app(app)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def bridge_of(store: MemoryStore, settings: CelerySettings, code: tuple[str, ...] = ()) -> Bridge:
    live = Live(store, namespace="proj", code=code, owner="django", writer="django")
    return Bridge(live, DjangoRows(), settings)


def every(seconds: int) -> Any:
    from django_celery_beat.models import IntervalSchedule

    return IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")[0]


def task(name: str, **fields: Any) -> Any:
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.create(name=name, task="proj.report", **fields)


def live_entries(store: MemoryStore) -> dict[str, Entry]:
    return {e.name: e for e in Live(store, namespace="proj").list()}


def test_rows_are_published_once_and_then_only_what_changed(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    bridge = bridge_of(store, settings)
    task("ping", interval=every(10), args="[1]")
    nightly = CrontabSchedule.objects.create(minute="0", hour="4", timezone=ZoneInfo("UTC"))
    task("nightly", crontab=nightly)
    first = bridge.poll()
    assert first is not None
    assert first.complete
    assert first.revision is not None
    assert sorted(first.revision.names) == ["nightly", "ping"]
    assert bridge.poll() is None  # the markers have not moved: nothing else read

    ping = PeriodicTask.objects.get(name="ping")
    ping.args = "[2]"
    ping.save()
    edited = bridge.poll()
    assert edited is not None
    assert edited.revision is not None
    assert (edited.read, edited.complete, edited.revision.names) == (1, False, ("ping",))
    assert live_entries(store)["ping"].args == (2,)
    assert live_entries(store)["nightly"].trigger == Cron("0 4 * * *", "UTC", day_and=True)

    ping.enabled = False
    ping.save()
    bridge.poll()
    assert live_entries(store)["ping"].enabled is False
    # A full pass over unchanged rows reads them all and writes nothing.
    again = bridge.poll(full=True)
    assert again is not None
    assert again.complete
    assert again.revision is None


def test_a_schedule_row_edit_a_delete_and_a_rename_are_found(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    bridge = bridge_of(store, settings)
    task("a", interval=every(10))
    task("b", interval=every(20))
    bridge.poll()
    interval = IntervalSchedule.objects.get(every=10)
    interval.every = 15  # its signal moves last_update; no task row's date_changed moves
    interval.save()
    found = bridge.poll()
    assert found is not None
    assert found.complete
    assert found.revision is not None
    assert live_entries(store)["a"].trigger == Every(timedelta(seconds=15))

    PeriodicTask.objects.get(name="b").delete()
    gone = bridge.poll()
    assert gone is not None
    assert gone.revision is not None
    assert set(live_entries(store)) == {"a"}

    row = PeriodicTask.objects.get(name="a")
    row.name = "a2"
    row.save()
    bridge.poll()
    assert set(live_entries(store)) == {"a2"}


def test_an_update_without_save_is_found_by_the_full_pass(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import PeriodicTask

    bridge = bridge_of(store, settings)
    task("quiet", interval=every(10))
    bridge.poll()
    PeriodicTask.objects.filter(name="quiet").update(args="[7]")  # no signal, no date_changed
    assert bridge.poll() is None
    found = bridge.poll(full=True)
    assert found is not None
    assert found.revision is not None
    assert live_entries(store)["quiet"].args == (7,)


def test_a_writer_whose_clock_is_behind_is_not_missed(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    bridge = bridge_of(store, settings)
    row = task("late", interval=every(10))
    bridge.poll()
    behind = row.date_changed - timedelta(seconds=3)
    PeriodicTask.objects.filter(pk=row.pk).update(args="[3]", date_changed=behind)
    PeriodicTasks.objects.filter(ident=1).update(last_update=behind)
    found = bridge.poll()
    assert found is not None
    assert found.complete
    assert found.revision is not None
    assert live_entries(store)["late"].args == (3,)


def test_a_solar_row_is_published_as_a_solar_entry(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import SolarSchedule

    pytest.importorskip("ephem")
    solar = SolarSchedule.objects.create(event="sunset", latitude=10, longitude=10)
    task("dusk", solar=solar)
    found = bridge_of(store, settings).poll()
    assert found is not None
    assert found.refused == []
    dusk = live_entries(store)["dusk"]
    assert dusk.trigger == Solar("sunset", 10.0, 10.0)
    assert dusk.options["headers"] == {"periodic_task_name": "dusk"}


def test_rows_the_bridge_cannot_run_are_refused_and_their_entry_removed(
    database: str,
    store: MemoryStore,
    settings: CelerySettings,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_celery_beat.models import PeriodicTask, SolarSchedule

    monkeypatch.setitem(sys.modules, "ephem", None)  # as if it were not installed
    Live(store, namespace="proj").put(Entry(name="by-hand", task="proj.x", trigger=Every(60)))
    bridge = bridge_of(store, settings, code=("from-code",))
    task("fine", interval=every(10))
    task("bad", interval=every(10))
    task("from-code", interval=every(10))
    task("by-hand", interval=every(10))
    solar = SolarSchedule.objects.create(event="sunset", latitude=10, longitude=10)
    task("dusk", solar=solar)
    first = bridge.poll()
    assert first is not None
    assert sorted(first.refused) == ["by-hand", "dusk", "from-code"]
    assert set(live_entries(store)) == {"fine", "bad", "by-hand"}
    assert live_entries(store)["by-hand"].task == "proj.x"  # the hand-written one stays
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "row 'dusk'" in said
    assert "pip install 'beatless[solar]'" in said  # only that row, naming the extra
    assert "code schedule" in said
    PeriodicTask.objects.filter(name="bad").update(kwargs="[not json")
    bridge.poll(full=True)
    assert set(live_entries(store)) == {"fine", "by-hand"}


def test_a_name_lives_in_one_source(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    task("row", interval=every(10))
    bridge_of(store, settings).poll()
    by_hand = Live(store, namespace="proj")
    with pytest.raises(ScheduleError, match=r"owned by 'django'.*Django admin"):
        by_hand.put(Entry(name="row", task="proj.x", trigger=Every(60)))
    with pytest.raises(ScheduleError, match="owned by 'django'"):
        by_hand.delete("row")


def test_a_one_off_row_keeps_its_occurrence_when_other_rows_change(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import CrontabSchedule

    bridge = bridge_of(store, settings)
    minutely = CrontabSchedule.objects.create(minute="*", timezone=ZoneInfo("UTC"))
    task("once", crontab=minutely, one_off=True)
    bridge.poll()
    before = live_entries(store)["once"].trigger
    task("other", interval=every(10))
    bridge.poll(full=True)
    assert live_entries(store)["once"].trigger == before
    now = datetime.now(UTC)
    assert now < before.instant <= now + timedelta(seconds=64)


def test_plans_and_reverts_by_hand_leave_the_bridges_entries_alone(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    task("row", interval=every(10))
    bridge_of(store, settings).poll()
    by_hand = Live(store, namespace="proj")
    by_hand.put(Entry(name="mine", task="proj.x", trigger=Every(60)))
    plan = by_hand.plan([Entry(name="other", task="proj.x", trigger=Every(60))])
    assert sorted(c.name for c in plan.changes) == ["mine", "other"]
    by_hand.apply(plan)
    assert set(live_entries(store)) == {"row", "other"}
    by_hand.revert(to=0)
    assert set(live_entries(store)) == {"row"}
    with pytest.raises(ScheduleError, match="owned by 'django'"):
        by_hand.plan([Entry(name="row", task="proj.x", trigger=Every(60))])


def test_a_poll_that_loses_the_revision_race_writes_nothing_and_compares_again(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    by_hand = Live(store, namespace="proj")

    class Racing(Live):
        """A writer whose first change comes just after another writer's revision."""

        raced = False

        def change(self, *args: Any, **kwargs: Any) -> Any:
            if not self.raced:
                self.raced = True
                by_hand.put(Entry(name="first", task="proj.x", trigger=Every(60)))
            return super().change(*args, **kwargs)

    live = Racing(store, namespace="proj", owner="django")
    bridge = Bridge(live, DjangoRows(), settings)
    task("row", interval=every(10))
    lost = bridge.poll()
    assert lost is not None
    assert lost.stale
    assert lost.revision is None
    assert set(live_entries(store)) == {"first"}
    again = bridge.poll()  # the markers have not moved, but the last poll wrote nothing
    assert again is not None
    assert again.revision is not None
    assert set(live_entries(store)) == {"first", "row"}


def test_a_beatless_beat_runs_the_bridge_and_stops_it_on_close(
    database: str, tmp_path: Any
) -> None:
    from beatless.celery import BeatScheduler

    task("beat-row", interval=every(10))
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beatless_store_url=f"sqlite:///{tmp_path / 'claims.db'}",
        beatless_django=True,
        beatless_django_database=database,
    )
    beat = BeatScheduler(app=app)
    try:
        assert beat.bridge is not None
        assert beat.bridge._thread.is_alive()
        store = beat.beatless.claim_store  # type: ignore[union-attr]
        polled = lambda: "beat-row" in {e.name for e in Live(store, namespace="proj").list()}  # noqa: E731
        deadline = time.monotonic() + 10
        while not polled() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert polled()
        thread = beat.bridge._thread
    finally:
        beat.close()
    assert beat.bridge is None
    assert not thread.is_alive()


@pytest.mark.parametrize("full", [True, False])
def test_a_poll_slower_than_another_never_publishes_the_rows_it_read_over_newer_ones(
    database: str, store: MemoryStore, settings: CelerySettings, full: bool
) -> None:
    from django_celery_beat.models import PeriodicTask

    task("ping", interval=every(10), args="[1]")
    task("pong", interval=every(10), args="[1]")
    first, other = bridge_of(store, settings), bridge_of(store, settings)
    first.poll()
    other.poll()
    ping = PeriodicTask.objects.get(name="ping")
    ping.args = "[2]"
    ping.save()
    PeriodicTask.objects.filter(name="pong").delete()

    def newer() -> None:
        """Once ``first`` has read ping at [2] and no pong, ping moves to [3], and
        ``other`` publishes both changes."""
        ping.args = "[3]"
        ping.save()
        assert other.poll(full=True) is not None

    first.rows = AfterRead(DjangoRows(), newer)
    slow = first.poll(full=full)  # one read: its publish is refused, nothing read after
    first.rows = DjangoRows()

    assert slow is not None
    assert (slow.revision, slow.stale) == (None, True)  # it read before the newer revision
    assert live_entries(store)["ping"].args == (3,)
    assert "pong" not in live_entries(store)
    again = first.poll()
    assert again is not None
    assert again.revision is None  # the next poll reads the rows again: nothing to publish


class Counted:
    """django-celery-beat's rows, counting the full reads (``all()``)."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows
        self.full_reads = 0

    def probe(self) -> Any:
        return self.rows.probe()

    def changed_since(self, instant: Any) -> Any:
        return self.rows.changed_since(instant)

    def by_ids(self, ids: Any) -> Any:
        return self.rows.by_ids(ids)

    def all(self) -> Any:
        self.full_reads += 1
        return self.rows.all()


def test_a_node_that_finds_only_rows_another_node_published_reads_no_other_row(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import PeriodicTask

    for n in range(3):
        task(f"tick-{n}", interval=every(1), args="[0]")
    nodes = [bridge_of(store, settings), bridge_of(store, settings)]
    for node in nodes:
        node.poll()
    counted = [Counted(node.rows) for node in nodes]
    for node, rows in zip(nodes, counted, strict=True):
        node.rows = rows
    # One edit a second, the two nodes taking turns: each finds the other's last edit
    # (already published) beside its own.
    for n in range(8):
        row = PeriodicTask.objects.get(name=f"tick-{n % 3}")
        row.args = f"[{n + 1}]"
        row.save()
        polled = nodes[n % 2].poll()
        assert polled is not None
        assert not polled.complete
        assert polled.revision is not None
        assert live_entries(store)[f"tick-{n % 3}"].args == (n + 1,)
    assert [rows.full_reads for rows in counted] == [0, 0]
    # The other node's turn finds only a row the first published: no full read either.
    row = PeriodicTask.objects.get(name="tick-0")
    row.args = "[99]"
    row.save()
    first, second = nodes
    published = first.poll()
    assert published is not None
    assert published.revision is not None
    found = second.poll()
    assert found is not None
    assert (found.read, found.complete, found.revision) == (1, False, None)
    assert [rows.full_reads for rows in counted] == [0, 0]
    # A schedule row edited with no task row changed still makes a node read every row.
    from django_celery_beat.models import IntervalSchedule

    interval = IntervalSchedule.objects.get(every=1)
    interval.every = 2
    interval.save()
    edited = second.poll()
    assert edited is not None
    assert edited.complete
    assert counted[1].full_reads == 1
    assert live_entries(store)["tick-1"].trigger == Every(timedelta(seconds=2))


def test_a_full_read_that_loses_makes_the_next_poll_partial_and_never_sets_a_row_back(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import PeriodicTask

    task("ping", interval=every(10), args="[1]")
    task("quiet", interval=every(10), args="[1]")
    task("back", interval=every(10), args="[1]")
    task("gone", interval=every(10), args="[1]")
    first, other = bridge_of(store, settings), bridge_of(store, settings)
    first.poll()
    other.poll()
    # Only a full read sees these: no signal, no date_changed.
    PeriodicTask.objects.filter(name="quiet").update(args="[2]")
    PeriodicTask.objects.filter(name="back").update(args="[2]")
    gone = PeriodicTask.objects.get(name="gone").pk
    PeriodicTask.objects.filter(pk=gone).update(name="gone-raw")  # a rename by raw update

    def newer() -> None:
        """Once ``first`` has read every row, ``back`` returns to [1] (no marker moves),
        ping is edited, and ``other`` publishes ping from a later read."""
        PeriodicTask.objects.filter(name="back").update(args="[1]")
        ping = PeriodicTask.objects.get(name="ping")
        ping.args = "[2]"
        ping.save()
        edited = other.poll()
        assert edited is not None
        assert edited.revision is not None

    counted = Counted(AfterRead(DjangoRows(), newer))
    first.rows = counted
    lost = first.poll(full=True)
    assert lost is not None
    assert (lost.complete, lost.revision, lost.stale) == (True, None, True)
    assert counted.full_reads == 1
    assert live_entries(store)["quiet"].args == (1,)  # nothing of the lost read published

    counted.rows = DjangoRows()
    again = first.poll()  # not a full read: what the lost one found, read again
    assert again is not None
    assert not again.complete
    assert counted.full_reads == 1
    assert again.revision is not None
    state = live_entries(store)
    assert state["quiet"].args == (2,)
    assert state["back"].args == (1,)  # its row returned to [1] after the lost read
    assert state["ping"].args == (2,)
    assert set(state) == {"ping", "quiet", "back", "gone-raw"}
    assert first.poll() is None  # nothing owed any more, the markers unchanged


def test_a_delete_beside_a_row_another_node_created_and_published_is_found(
    database: str, store: MemoryStore, settings: CelerySettings
) -> None:
    from django_celery_beat.models import PeriodicTask

    task("a", interval=every(10))
    task("b", interval=every(10))
    first, other = bridge_of(store, settings), bridge_of(store, settings)
    first.poll()
    other.poll()
    task("c", interval=every(10))
    created = other.poll()
    assert created is not None
    assert created.revision is not None
    PeriodicTask.objects.get(name="a").delete()  # the count is back to what first saw
    found = first.poll()  # finds only c, already published: the delete is still seen
    assert found is not None
    assert found.complete
    assert set(live_entries(store)) == {"b", "c"}
