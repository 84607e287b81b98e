"""The size limits of the store's notes are rules: a name too long for them is a problem
of ``beatless check`` (with and without ``--store``) and refused at start, naming the
entry, the limit and the length; a name at the limit runs and is recorded.

Every store keeps notes up to ``NOTE_NAME_LIMIT`` characters of name and
``NOTE_VALUE_LIMIT`` bytes of value (the contract suite, ``tests/test_store_notes.py``,
holds each store to both), so the rules are the same on every store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from stores import StoreFactory
from test_scheduler import T0, Clock

from beatless import Entry, Every, Schedule, ScheduleError
from beatless.cli.command import main
from beatless.fleet._notes import history_kind
from beatless.fleet.limits import checked, limits
from beatless.node.scheduler import Scheduler
from beatless.stores.base import NOTE_NAME_LIMIT, NOTE_VALUE_LIMIT
from beatless.stores.memory import MemoryStore

ADDRESS_LIMIT = NOTE_NAME_LIMIT - len(history_kind(""))  # 983
NAMESPACE = "shop"
LONGEST_NAME = ADDRESS_LIMIT - len(f"{NAMESPACE}/")


def toml(tmp_path: Path, name: str, tenants: list[str] | None = None) -> str:
    path = tmp_path / "schedule.toml"
    lines = [
        f"namespace = {json.dumps(NAMESPACE)}",
        "[[entry]]",
        f"name = {json.dumps(name)}",
        'task = "tasks.t"',
        'every = "60s"',
    ]
    if tenants is not None:
        lines.append(f"tenants = {json.dumps(tenants)}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


STORES = [[], ["--store", "memory://"], ["--store", "sqlite:///{tmp}/claims.db"]]


def check(path: str, store: list[str], tmp_path: Path) -> int:
    return main(["check", path, *(arg.format(tmp=tmp_path) for arg in store)])


@pytest.mark.parametrize("store", STORES, ids=["no-store", "memory", "sqlite"])
def test_check_refuses_an_entry_name_too_long_for_its_history_note(
    tmp_path: Path, store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    name = "n" * (LONGEST_NAME + 8)  # 983 + 8 characters of address: the issue's > 983
    assert check(toml(tmp_path, name), store, tmp_path) == 1
    err = capsys.readouterr().err
    assert "1 problem(s)" in err
    assert "entry 'nnnn" in err
    assert f"is {ADDRESS_LIMIT + 8} characters, over the {ADDRESS_LIMIT}" in err
    assert "shorten the entry name (or the namespace) by 8 characters" in err


@pytest.mark.parametrize("store", STORES, ids=["no-store", "memory", "sqlite"])
def test_check_passes_an_entry_name_at_the_limit(
    tmp_path: Path, store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(toml(tmp_path, "n" * LONGEST_NAME), store, tmp_path) == 0
    assert "sound" in capsys.readouterr().out


@pytest.mark.parametrize("store", STORES, ids=["no-store", "memory", "sqlite"])
def test_check_refuses_a_tenant_too_long_for_its_history_note(
    tmp_path: Path, store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    longest = ADDRESS_LIMIT - len(f"{NAMESPACE}/fan/")
    tenants = ["acme", "t" * (longest + 1), "u" * 1_200]
    assert check(toml(tmp_path, "fan", tenants), store, tmp_path) == 1
    err = capsys.readouterr().err
    assert "entry 'fan': 2 tenant(s) make addresses" in err
    assert f"over the {ADDRESS_LIMIT} characters" in err
    assert "is 1200 characters" in err
    assert f"tenants of this entry may have at most {longest}" in err


@pytest.mark.parametrize("store", STORES, ids=["no-store", "memory", "sqlite"])
def test_check_refuses_an_entry_whose_note_is_over_the_note_value_limit(
    tmp_path: Path, store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # The case: 20 tenants of 900 characters; the entry note lists the first 20.
    tenants = [f"{i:02d}" + "x" * 898 for i in range(20)]
    assert check(toml(tmp_path, "fan", tenants), store, tmp_path) == 1
    err = capsys.readouterr().err
    assert "entry 'fan': what the fleet shows of it" in err
    assert f"over the {NOTE_VALUE_LIMIT} a note may hold" in err
    assert "shorten its task name or its first tenants' names" in err


def test_check_refuses_a_nul_in_a_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(toml(tmp_path, "fan", ["acme", "a\x00b"]), [], tmp_path) == 1
    assert "1 tenant(s) hold a NUL character" in capsys.readouterr().err


def test_check_refuses_a_namespace_too_long_for_the_registry_note() -> None:
    entry = Entry(name="e", task="t", trigger=Every(60))
    found = checked([entry], [], namespace="n" * 990, timezone="UTC")
    assert not found.is_sound
    assert found.problems[0].startswith("namespace 'nnn")
    assert f"over the {NOTE_NAME_LIMIT} a note's name may have" in found.problems[0]


def test_the_front_ends_collection_reports_the_limits_with_the_other_problems() -> None:
    # What `check --celery`, `check --dramatiq` and both integrations' start-up run.
    entries = [
        Entry(name="a" * 1_000, task="t", trigger=Every(60)),
        Entry(name="fan", task="t", trigger=Every(60), tenants=["x" * 2_000]),
    ]
    found = checked(entries, ["entry 'b': an earlier problem"], namespace="ns", timezone="UTC")
    assert len(found.problems) == 3
    assert found.problems[1].startswith("entry 'aaa")
    assert found.problems[2].startswith("entry 'fan': 1 tenant(s)")


def test_a_node_refuses_to_start_with_a_name_too_long_for_the_store() -> None:
    schedule = Schedule([Entry(name="n" * 1_000, task="t", trigger=Every(60))])
    with pytest.raises(ScheduleError) as raised:
        Scheduler(schedule, store=MemoryStore())
    assert len(raised.value.errors) == 1
    assert "shorten the entry name (or the namespace) by 25 characters" in str(raised.value)


def test_names_at_the_limits_run_and_their_history_and_entry_notes_are_written() -> None:
    clock = Clock(T0 - 1)
    store = MemoryStore(clock=clock)
    tenant = "t" * (ADDRESS_LIMIT - len(f"{NAMESPACE}/fan/"))
    entries = [
        Entry(name="n" * LONGEST_NAME, task="t", trigger=Every(60)),
        Entry(name="fan", task="t", trigger=Every(60), tenants=[tenant]),
    ]
    schedule = Schedule(entries, namespace=NAMESPACE)
    assert limits(schedule) == []
    sent: list[str] = []
    node = Scheduler(schedule, store=store, clock=clock, enqueue=lambda f: sent.append(f.id))
    clock.ms = round(T0 * 1_000) + 100
    decisions = [d for d in node.tick() if d.firing.occurrence_ms == round(T0 * 1_000)]
    assert [d.outcome for d in decisions] == ["won", "won"]
    node.board.sync()
    addresses = [schedule.address(entries[0]), schedule.address(entries[1], tenant)]
    kinds = [history_kind(a) for a in addresses]
    assert max(len(k) for k in kinds) == NOTE_NAME_LIMIT
    notes = store.read_notes([*kinds, f"beatless/{NAMESPACE}/entries"])
    assert all(len(notes[k]) == 1 for k in kinds)
    assert len(notes[f"beatless/{NAMESPACE}/entries"]) == 2
    assert len(sent) == 2


@pytest.mark.slow
def test_on_every_store_a_name_over_the_limit_is_refused_and_one_at_it_is_sent_once(
    store_factory: StoreFactory,
) -> None:
    """The limits are the same on every store: a node refuses at start an entry whose
    address is one character over them, and sends an entry and a tenant at them exactly
    once per occurrence, with their history and entry notes written."""
    too_long = Schedule([Entry(name="n" * (LONGEST_NAME + 1), task="t", trigger=Every(60))])
    with pytest.raises(ScheduleError):
        Scheduler(too_long, store=store_factory())

    tenant = "t" * (ADDRESS_LIMIT - len(f"{NAMESPACE}/fan/"))
    entries = [
        Entry(name="n" * LONGEST_NAME, task="t", trigger=Every(1)),
        Entry(name="fan", task="t", trigger=Every(1), tenants=[tenant]),
    ]
    schedule = Schedule(entries, namespace=NAMESPACE)
    clock = store_factory.clock if store_factory.exact_clock else time.time
    sent: list[str] = []
    node = Scheduler(
        schedule, store=store_factory(), clock=clock, enqueue=lambda f: sent.append(f.id)
    )
    won: list[str] = []
    for _ in range(40):
        store_factory.advance(100)
        won += [d.firing.entry.name for d in node.tick() if d.outcome == "won"]
        if {"fan", entries[0].name} <= set(won):
            break
    assert {"fan", entries[0].name} <= set(won), won
    assert len(sent) == len(set(sent)) == len(won)
    node.board.sync()
    store = store_factory()
    kinds = [
        history_kind(schedule.address(entries[0])),
        history_kind(schedule.address(entries[1], tenant)),
    ]
    notes = store.read_notes([*kinds, f"beatless/{NAMESPACE}/entries"])
    assert all(notes[k] for k in kinds), {k[:40]: len(v) for k, v in notes.items()}
    assert len(notes[f"beatless/{NAMESPACE}/entries"]) == 2
