"""One-offs and windows (issue 24, item 5): ``At(instant)``, ``start_at``/``end_at`` and
``enabled`` on any entry, from every front end; the nodes driven by a fake clock on the
memory store."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import T0, Clock, run_nodes

from beatless import At, ConfigError, Cron, Entry, Every, Firing, Schedule, ScheduleError
from beatless.cli._toml import schedule_toml
from beatless.cli.loader import load_toml, schedule_from_mapping
from beatless.core.triggers import Trigger, Windowed
from beatless.fleet._missed import entry_views, missed_occurrences
from beatless.fleet._notes import HistoryItem
from beatless.live.codec import entry_from_json, entry_to_json
from beatless.node.scheduler import Scheduler
from beatless.schedule._window import silence, unscheduled
from beatless.schedule.firing import firing_id, iso
from beatless.stores.memory import MemoryStore

T0_MS = round(T0 * 1_000)
"""2026-11-29T02:00:00Z."""
HOUR_MS = 3_600_000


def one_off(name: str = "once", at_ms: int = T0_MS + 10_000, **kw: object) -> Entry:
    return Entry(name=name, task="tasks.once", trigger=At(at_ms), **kw)  # type: ignore[arg-type]


class ShortMemory(MemoryStore):
    """A store that remembers a claim five minutes, as a NATS bucket does by default."""

    name = "nats"

    @property
    def remembers(self) -> timedelta:
        return timedelta(minutes=5)


# -- the At trigger -------------------------------------------------------------------


@settings(max_examples=300)
@given(instant=st.integers(-(2**40), 2**45), asked=st.integers(-(2**40), 2**45))
def test_a_one_off_has_exactly_one_occurrence_seen_from_any_instant(
    instant: int, asked: int
) -> None:
    found = list(At(instant).after(asked))
    assert found == ([instant] if instant > asked else [])


def test_a_one_off_reads_an_aware_datetime_epoch_ms_and_iso_text_alike() -> None:
    paris = timezone(timedelta(hours=1))
    given = (
        At(datetime(2027, 1, 1, 10, 0, tzinfo=paris)),
        At(1_798_794_000_000),
        At("2027-01-01T09:00:00Z"),
        At("2027-01-01T10:00:00+01:00"),
    )
    assert len(set(given)) == 1
    assert given[0].describe() == "at 2027-01-01T09:00:00.000Z"
    assert given[0].min_gap_ms() > 10**15  # no jitter is too wide for one occurrence


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (datetime(2027, 1, 1, 9, 0), "2027-01-01T09:00:00 has no UTC offset"),
        ("2027-01-01T09:00:00", "'2027-01-01T09:00:00' has no UTC offset"),
        ("tomorrow", "cannot read 'tomorrow' as an ISO 8601 instant"),
        (True, "expected an aware datetime, epoch milliseconds or ISO 8601 text"),
        (10**20, "out of range"),
    ],
)
def test_a_naive_or_unreadable_instant_is_refused_saying_what_to_give(
    value: object, said: str
) -> None:
    with pytest.raises(ConfigError, match=r"^at: ") as refused:
        At(value)  # type: ignore[arg-type]
    assert said in str(refused.value)


# -- windows --------------------------------------------------------------------------

TRIGGERS = st.one_of(
    st.builds(lambda s: Every(timedelta(seconds=s)), st.integers(1, 7 * 86_400)),
    st.sampled_from([Cron("*/5 * * * *"), Cron("0 2 * * *", "Europe/Berlin"), Cron("@hourly")]),
    st.builds(At, st.integers(0, 2 * 10**12)),
)


@settings(max_examples=200, deadline=None)
@given(
    trigger=TRIGGERS,
    start=st.none() | st.integers(0, 2 * 10**12),
    length=st.none() | st.integers(1, 30 * 86_400_000),
    asked=st.integers(0, 2 * 10**12),
)
def test_no_occurrence_outside_the_window_is_ever_produced_and_none_inside_is_lost(
    trigger: Trigger, start: int | None, length: int | None, asked: int
) -> None:
    end = None if length is None else (start or 0) + length
    window = Windowed(trigger, start, end)
    found = list(islice(window.after(asked), 50))
    assert all(o > asked for o in found)
    assert all(start is None or o >= start for o in found)  # the start is in the window
    assert all(end is None or o < end for o in found)  # the end is not
    since = asked if start is None else max(asked, start - 1)
    expected = [o for o in islice(trigger.after(since), 50) if end is None or o < end]
    assert found == expected  # and every occurrence inside it is kept


def test_a_window_that_ends_before_it_starts_is_refused_naming_the_entry() -> None:
    with pytest.raises(ConfigError, match=r"entry 'w': end_at .* must be after start_at"):
        Entry(
            name="w",
            task="t",
            trigger=Every(60),
            start_at="2027-01-02T00:00:00Z",
            end_at="2027-01-01T00:00:00Z",
        )
    with pytest.raises(ConfigError, match="must be after start_at"):
        Entry(name="w", task="t", trigger=Every(60), start_at=1_000, end_at=1_000)
    with pytest.raises(ConfigError, match=r"entry 'w': start_at: .* has no UTC offset"):
        Entry(name="w", task="t", trigger=Every(60), start_at=datetime(2027, 1, 1))


def test_a_window_changes_the_fingerprint_and_an_entry_without_one_hashes_as_before() -> None:
    plain = Schedule([Entry(name="e", task="t", trigger=Every(60))])
    windowed = Schedule([Entry(name="e", task="t", trigger=Every(60), end_at=10**12)])
    disabled = Schedule([Entry(name="e", task="t", trigger=Every(60), enabled=False)])
    assert len({plain.fingerprint, windowed.fingerprint, disabled.fingerprint}) == 3
    # An entry without a window hashes as it did before windows existed.
    assert plain.entries[0].windowed is plain.entries[0].trigger


# -- max_late of a one-off ------------------------------------------------------------


def test_a_one_off_takes_an_hour_of_max_late_unless_set_and_others_a_minute() -> None:
    assert one_off().max_late == timedelta(hours=1)
    assert one_off(max_late="10m").max_late == timedelta(minutes=10)
    assert Entry(name="e", task="t", trigger=Every(60)).max_late == timedelta(seconds=60)
    top = schedule_from_mapping(
        {"max_late": "2m", "entry": [{"name": "o", "task": "t", "at": "2027-01-01T09:00:00Z"}]}
    )
    assert top.entries[0].max_late == timedelta(minutes=2)  # a default of every entry is set


def test_a_one_offs_default_max_late_is_fitted_to_what_the_store_remembers() -> None:
    clock = Clock()
    node = Scheduler(
        Schedule([one_off(), one_off("jittered", jitter="30s")]),
        store=ShortMemory(clock=clock),
        clock=clock,
    )
    fitted = {e.name: e for e in node.schedule.entries}
    # 5m - 10s tolerance - 1s, then the jitter: every claim is remembered long enough.
    assert fitted["once"].max_late == timedelta(minutes=4, seconds=49)
    assert fitted["jittered"].max_late == timedelta(minutes=4, seconds=19)
    assert all(e.memory_needed < timedelta(minutes=5) for e in fitted.values())
    assert not fitted["once"].max_late_given  # still the default, read as it is
    on_redis_like = Schedule([one_off()]).fitted(None)
    assert on_redis_like.entries[0].max_late == timedelta(hours=1)


def test_a_one_offs_max_late_set_too_long_for_the_store_is_refused_naming_the_numbers() -> None:
    with pytest.raises(
        ScheduleError,
        match=r"entry 'once': jitter 0s \+ max_late 2h .* must be under what nats remembers "
        r"\(5m\); lower max_late",
    ):
        Scheduler(Schedule([one_off(max_late="2h")]), store=ShortMemory())


# -- nodes ----------------------------------------------------------------------------


def node(store: MemoryStore, clock: Clock, entries: list[Entry], sent: list[Firing], name: str):
    return Scheduler(Schedule(entries), store=store, clock=clock, node=name, enqueue=sent.append)


def test_a_one_off_fires_once_across_two_nodes_and_a_restart() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    sent: list[Firing] = []
    a, b = (node(store, clock, [one_off()], sent, n) for n in ("a", "b"))
    run_nodes([a, b], clock, 30)
    assert [f.occurrence_ms for f in sent] == [T0_MS + 10_000]
    restarted = node(store, clock, [one_off()], sent, "a")  # within max_late: it catches up
    run_nodes([restarted, b], clock, 30)
    later = node(store, clock, [one_off()], sent, "c")
    clock.ms += HOUR_MS  # and past max_late: nothing is left to claim
    run_nodes([restarted, b, later], clock, 5)
    assert len(sent) == 1
    assert sent[0].id == firing_id("default/once", T0_MS + 10_000)


def test_a_node_started_after_the_instant_within_max_late_fires_it_once() -> None:
    clock = Clock(T0 + 20 * 60)  # twenty minutes after the one-off, no node ran then
    store = MemoryStore(clock=clock)
    sent: list[Firing] = []
    first = node(store, clock, [one_off()], sent, "first")
    run_nodes([first], clock, 2)
    second = node(store, clock, [one_off()], sent, "second")
    run_nodes([first, second], clock, 5)
    assert [(f.occurrence_ms, f.manual) for f in sent] == [(T0_MS + 10_000, False)]


def test_a_node_started_after_max_late_never_fires_the_one_off() -> None:
    clock = Clock(T0 + 10 + 3_601)
    sent: list[Firing] = []
    late = node(MemoryStore(clock=clock), clock, [one_off()], sent, "late")
    decisions = late.tick()
    run_nodes([late], clock, 5)
    assert (sent, decisions) == ([], [])


def test_a_node_sends_only_the_occurrences_inside_the_window() -> None:
    clock = Clock()
    sent: list[Firing] = []
    window = Entry(
        name="w",
        task="t",
        trigger=Every(1),
        start_at=T0_MS + 2_000,
        end_at=T0_MS + 5_000,
        catch_up="all",
    )
    run_nodes([node(MemoryStore(clock=clock), clock, [window], sent, "n")], clock, 12)
    assert [f.occurrence_ms - T0_MS for f in sent] == [2_000, 3_000, 4_000]


@settings(max_examples=25, deadline=None)
@given(
    every_s=st.integers(1, 4),
    start_s=st.integers(-8, 12),
    length_s=st.integers(1, 15),
    jitter_ms=st.integers(0, 400),
)
def test_a_node_never_sends_an_occurrence_outside_any_window(
    every_s: int, start_s: int, length_s: int, jitter_ms: int
) -> None:
    clock = Clock()
    start, end = T0_MS + start_s * 1_000, T0_MS + (start_s + length_s) * 1_000
    entry = Entry(
        name="w",
        task="t",
        trigger=Every(every_s),
        jitter=timedelta(milliseconds=jitter_ms),
        start_at=start,
        end_at=end,
        catch_up="all",
    )
    sent: list[Firing] = []
    run_nodes([node(MemoryStore(clock=clock), clock, [entry], sent, "n")], clock, 25, step=0.25)
    occurrences = [f.occurrence_ms for f in sent]
    assert all(start <= o < end for o in occurrences)
    step = every_s * 1_000
    inside = range(-(-start // step) * step, end, step)
    assert [o for o in occurrences if o <= T0_MS + 19_000] == [
        o for o in inside if o <= T0_MS + 19_000
    ]  # released by T0 + 19.4s, the run ends at T0 + 20s


def test_a_disabled_entry_is_known_but_schedules_nothing() -> None:
    clock = Clock()
    sent: list[Firing] = []
    off = Entry(name="off", task="t", trigger=Every(1), enabled=False, catch_up="all")
    on = Entry(name="on", task="t", trigger=Every(1))
    scheduler = node(MemoryStore(clock=clock), clock, [off, on], sent, "n")
    run_nodes([scheduler], clock, 5)
    assert {f.entry.name for f in sent} == {"on"}
    assert [e.name for e in scheduler.schedule.entries] == ["off", "on"]


def test_neither_a_disabled_entry_nor_one_outside_its_window_is_ever_missed() -> None:
    schedule = Schedule(
        [
            Entry(name="off", task="t", trigger=Every(10), enabled=False),
            Entry(name="ended", task="t", trigger=Every(10), end_at=T0_MS - 1_795_000),
            Entry(name="plain", task="t", trigger=Every(10)),
        ]
    )
    views = {v.name: v for v in entry_views(schedule)}
    assert views["ended"].describe == f"every 10s until {iso(T0_MS - 1_795_000)}"
    assert views["off"].describe == "every 10s (disabled)"
    for view in views.values():
        sent = HistoryItem(
            id=firing_id(view.address, T0_MS - 1_800_000),
            entry=view.name,
            tenant=None,
            occurrence_ms=T0_MS - 1_800_000,
            release_ms=T0_MS - 1_800_000,
            node="n",
            outcome="won",
            lateness_ms=0,
            at_ms=T0_MS - 1_800_000,
        )
        missed = missed_occurrences(view, [sent], T0_MS)
        assert (missed != []) is (view.name == "plain"), view.name


# -- said truthfully ------------------------------------------------------------------


def test_silence_says_why_an_entry_has_no_occurrence_to_come() -> None:
    now = T0_MS
    assert silence(Entry(name="e", task="t", trigger=Every(60)), now) is None
    assert silence(Entry(name="e", task="t", trigger=Every(60), enabled=False), now) == (
        "disabled: known, but it schedules nothing"
    )
    ended = Entry(name="e", task="t", trigger=Every(60), end_at=now - 1_000)
    assert silence(ended, now) == f"window ended at {iso(now - 1_000)}: no occurrence after it"
    assert "past; sent once" in (silence(one_off(at_ms=now - 60_000), now) or "")
    gone = silence(one_off(at_ms=now - HOUR_MS - 1), now) or ""
    assert "past max_late; never fired again" in gone
    outside = one_off(at_ms=now + 60_000, end_at=now + 1_000)
    assert silence(outside, now) == (
        f"one-off at {iso(now + 60_000)}: at or after the end of the entry's window, "
        f"{iso(now + 1_000)}"
    )
    early = one_off(at_ms=now + 60_000, start_at=now + 120_000)
    assert unscheduled(early, now + 60_000) == (
        f"before the entry's window starts at {iso(now + 120_000)}"
    )


WINDOWED_TOML = """
namespace = "shop"

[[entry]]
name = "launch"
task = "shop.launch"
at = 2026-11-29T02:00:10Z

[[entry]]
name = "promo"
task = "shop.promo"
every = "1m"
start_at = "2026-11-29T02:00:00Z"
end_at = 2026-11-29T02:03:00+00:00

[[entry]]
name = "paused-for-now"
task = "shop.sync"
cron = "0 * * * *"
enabled = false
"""


def test_next_and_explain_say_what_a_window_and_enabled_leave_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from beatless.cli.command import main

    path = tmp_path / "s.toml"
    path.write_text(WINDOWED_TOML)
    assert main(["next", str(path), "--count", "5", "--after", "2026-11-29T02:01:30Z"]) == 0
    out = capsys.readouterr().out
    assert "shop/promo" in out
    assert "02:02:00.000Z" in out
    assert "02:03:00" not in out
    assert "shop/paused-for-now" not in out.split("entry 'launch'")[0]
    assert "entry 'launch': one-off at 2026-11-29T02:00:10.000Z: past; sent once" in out
    assert "entry 'paused-for-now': disabled: known, but it schedules nothing" in out
    assert main(["next", str(path), "--entry", "promo", "--after", "2026-11-29T02:05:00Z"]) == 0
    assert "entry 'promo': window ended at 2026-11-29T02:03:00.000Z" in capsys.readouterr().out

    assert main(["explain", str(path), "promo", "--at", "2026-11-29T02:04:00Z"]) == 1
    out = capsys.readouterr().out
    assert "every 1m from 2026-11-29T02:00:00.000Z until 2026-11-29T02:03:00.000Z" in out
    assert "scheduled   no: at or after the end of the entry's window, 2026-11-29T02:03:00" in out
    assert main(["explain", str(path), "launch", "--at", "2026-11-29T02:00:10Z"]) == 0
    assert "at 2026-11-29T02:00:10.000Z, task 'shop.launch'" in capsys.readouterr().out
    assert main(["explain", str(path), "paused-for-now", "--at", "2026-11-29T03:00:00Z"]) == 1
    assert "no: the entry is disabled" in capsys.readouterr().out


# -- every front end ------------------------------------------------------------------


def test_the_schedule_file_reads_at_and_windows_and_export_writes_them_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(WINDOWED_TOML)
    loaded = load_toml(path)
    launch, promo, paused = loaded.entries
    assert launch.trigger == At("2026-11-29T02:00:10Z")
    assert launch.max_late == timedelta(hours=1)
    assert not launch.max_late_given
    assert (promo.start_at, promo.end_at) == (
        datetime(2026, 11, 29, 2, 0, tzinfo=UTC),
        datetime(2026, 11, 29, 2, 3, tzinfo=UTC),
    )
    assert not paused.enabled
    again = tmp_path / "again.toml"
    again.write_text(schedule_toml(loaded.entries, namespace="shop", timezone="UTC"))
    assert 'at = "2026-11-29T02:00:10.000Z"' in again.read_text()
    reloaded = load_toml(again)
    assert list(map(entry_to_json, reloaded.entries)) == list(map(entry_to_json, loaded.entries))
    assert reloaded.fingerprint == loaded.fingerprint


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"at": "2027-01-01T09:00:00"}, "has no UTC offset"),
        ({"at": "2027-01-01T09:00:00Z", "every": "1m"}, "give exactly one of 'cron'"),
        ({"at": "2027-01-01T09:00:00Z", "anchor": 0}, "does not apply to 'at'"),
        ({"every": "1m", "start_at": "soon"}, "start_at: cannot read 'soon'"),
        ({"every": "1m", "enabled": "no"}, "enabled must be true or false"),
    ],
)
def test_the_schedule_file_refuses_a_bad_one_off_or_window_naming_the_entry(
    table: dict[str, object], said: str
) -> None:
    with pytest.raises(ScheduleError) as refused:
        schedule_from_mapping({"entry": [{"name": "x", "task": "t", **table}]})
    assert any(e.startswith("entry 'x'") and said in e for e in refused.value.errors), refused


def test_a_window_is_an_entrys_own_not_a_default_of_every_entry() -> None:
    with pytest.raises(ScheduleError, match=r"top level: unknown key\(s\) 'enabled'"):
        schedule_from_mapping({"enabled": False, "entry": [{"name": "x", "task": "t", "every": 1}]})


def test_the_live_codec_writes_version_2_only_for_what_version_1_would_run_wrongly() -> None:
    plain = Entry(name="p", task="t", trigger=Every(60))
    assert entry_to_json(plain)["v"] == 1
    assert set(entry_to_json(plain)) == set(entry_to_json(plain.replace(max_late="2m")))
    for entry in (
        one_off(),
        one_off(max_late="10m", start_at=T0_MS),
        plain.replace(end_at="2027-01-01T00:00:00Z"),
        plain.replace(enabled=False),
    ):
        data = entry_to_json(entry)
        assert data["v"] == 2, entry
        back = entry_from_json(data)
        assert entry_to_json(back) == data
        assert (back.trigger, back.windowed, back.enabled) == (
            entry.trigger,
            entry.windowed,
            entry.enabled,
        )
        assert (back.max_late, back.max_late_given) == (entry.max_late, entry.max_late_given)


def test_celery_beat_schedule_takes_a_one_off_and_a_window_in_its_beatless_options() -> None:
    from celery import Celery

    from beatless.celery import read_schedule

    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beatless_store_url="memory://",
        beat_schedule={
            "launch": {"task": "proj.launch", "schedule": At("2027-01-01T09:00:00Z")},
            "promo": {
                "task": "proj.promo",
                "schedule": 60,
                "options": {
                    "beatless": {"start_at": "2027-01-01T00:00:00Z", "end_at": 1_800_000_000_000}
                },
            },
            "off": {
                "task": "proj.sync",
                "schedule": 60,
                "options": {"beatless": {"enabled": False}},
            },
        },
    )
    launch, promo, off = read_schedule(app).entries
    assert launch.trigger == At("2027-01-01T09:00:00Z")
    assert launch.max_late == timedelta(hours=1)
    assert promo.windowed == Windowed(Every(60), 1_798_761_600_000, 1_800_000_000_000)
    assert not off.enabled
    app.conf.beat_schedule["promo"]["options"]["beatless"]["start_at"] = datetime(2027, 1, 1)
    with pytest.raises(ScheduleError, match=r"entry 'promo': start_at: .* has no UTC offset"):
        read_schedule(app)


def test_dramatiq_declares_a_one_off_and_a_window_beside_the_actor() -> None:
    from beatless.dramatiq import at, cron

    once = at("2027-01-01T09:00:00Z", args=(1,)).entry("launch")
    assert (once.trigger, once.max_late, once.args) == (
        At("2027-01-01T09:00:00Z"),
        timedelta(hours=1),
        (1,),
    )
    windowed = cron("0 * * * *", end_at="2027-01-01T00:00:00Z", enabled=False).entry("sync")
    assert windowed.end_at == datetime(2027, 1, 1, tzinfo=UTC)
    assert not windowed.enabled
    naive = at("2027-01-01T09:00:00")
    assert naive.trigger is None
    assert "has no UTC offset" in naive.problems[0]
    with pytest.raises(ScheduleError, match="entry 'sync': unknown setting"):
        cron("0 * * * *", end="2027-01-01T00:00:00Z").entry("sync")


def test_a_live_one_off_fires_once_from_its_fence() -> None:
    from beatless.live import Live

    clock = Clock()
    store = MemoryStore(clock=clock)
    sent: list[Firing] = []
    nodes = [node(store, clock, [], sent, n) for n in ("a", "b")]
    Live(store, namespace="default").put(one_off(at_ms=T0_MS + 20_000), effective_in="5s")
    for _ in range(300):
        clock.ms += 100
        for n in nodes:
            n.board.sync()
            n.tick()
    assert Counter(f.occurrence_ms for f in sent) == {T0_MS + 20_000: 1}
