"""A schedule written as TOML (``beatless.cli._toml``) loads back as the same entries."""

from __future__ import annotations

import re
import tomllib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from stores import StoreFactory

from beatless.cli._toml import schedule_toml
from beatless.cli.loader import load_toml
from beatless.core.triggers import Cron, Every
from beatless.errors import ConfigError
from beatless.live import Live, entry_to_json
from beatless.schedule.entry import Entry, Schedule

ENTRIES = [
    Entry(name="nightly", task="app.report", trigger=Cron("0 4 * * *"), args=(1, "two", True)),
    Entry(
        name="paris friday 13",
        task="app.friday",
        trigger=Cron("0 0 13 * 5", "Europe/Paris", day_and=True),
        kwargs={"to": "ops", "odd key": [1.5, -0.0, 1e20, -(2**63)], 'é\x7f\n"': {"deep": {}}},
        options={"queue": "slow", "priority": 3},
        jitter="2m",
        max_late="1h30m",
        tenants=("acme", "globex"),
        catch_up="all",
        overlap="skip",
        run_lease="45s",
        heartbeat="250ms",
        once_only=False,
    ),
    Entry(
        name="fine",
        task="app.fine",
        trigger=Every(timedelta(seconds=1, microseconds=7), datetime(2026, 1, 1, 0, 0, 0, 5, UTC)),
        max_late=timedelta(seconds=90, microseconds=3),
    ),
    Entry(name="plain", task="app.plain", trigger=Every("30s"), args=[[], {}]),
]


def test_every_entry_written_loads_back_equal_with_its_zone_bound_to_the_files(
    tmp_path: Path,
) -> None:
    path = tmp_path / "schedule.toml"
    path.write_text(
        schedule_toml(ENTRIES, namespace="billing", timezone="America/New_York", header="a\nb")
    )

    loaded = load_toml(path)

    expected = Schedule(ENTRIES, namespace="billing", timezone="America/New_York")
    assert (loaded.namespace, loaded.timezone) == ("billing", "America/New_York")
    assert [entry_to_json(e) for e in loaded.entries] == [
        entry_to_json(e) for e in expected.entries
    ]
    assert loaded.entries[0].trigger == Cron("0 4 * * *", "America/New_York")


def test_only_options_that_differ_from_their_defaults_are_written() -> None:
    table = tomllib.loads(schedule_toml(ENTRIES[:1], namespace="n", timezone="UTC"))["entry"][0]
    assert table == {
        "name": "nightly",
        "task": "app.report",
        "cron": "0 4 * * *",
        "args": [1, "two", True],
    }


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        (Entry(name="n", task="t", trigger=Every(1), args=(None,)), "args[0] holds null"),
        (Entry(name="n", task="t", trigger=Every(1), kwargs={"a": {"b": None}}), "kwargs.a.b"),
        (Entry(name="n", task="t", trigger=Every(1), args=(2**64,)), "args[0] holds int"),
    ],
)
def test_a_value_toml_cannot_hold_is_refused_naming_the_entry_and_where(
    entry: Entry, where: str
) -> None:
    with pytest.raises(ConfigError, match=f"entry 'n': {re.escape(where)}"):
        schedule_toml([entry], namespace="n", timezone="UTC")


def test_live_entries_exported_from_every_store_load_back_equal(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    store = store_factory()
    if not store.keeps_notes:
        pytest.skip(f"the {store.name} store refuses live entries")
    live = Live(store, namespace=f"toml-{uuid.uuid4().hex[:8]}", timezone="Europe/Paris")
    live.put_many(ENTRIES)
    path = tmp_path / "export.toml"

    path.write_text(schedule_toml(live.list(), namespace=live.namespace, timezone=live.timezone))

    expected = Schedule(live.list(), namespace=live.namespace, timezone=live.timezone)
    assert [entry_to_json(e) for e in load_toml(path).entries] == [
        entry_to_json(e) for e in expected.entries
    ]
