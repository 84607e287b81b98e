"""Loading schedules from TOML files and from module:attribute targets."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beatless import ConfigError, Cron, Entry, Every, Schedule, ScheduleError
from beatless.cli.loader import ENTRY_KEYS, load_schedule

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def write(tmp_path: Path, text: str, name: str = "schedule.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def errors_of(target: str) -> list[str]:
    with pytest.raises(ScheduleError) as caught:
        load_schedule(target)
    return caught.value.errors


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("sched_mod_")]:
        del sys.modules[name]


def test_toml_entries_get_their_triggers_and_values(tmp_path: Path) -> None:
    target = write(
        tmp_path,
        """
        namespace = "billing"
        timezone = "Europe/Berlin"

        [[entry]]
        name = "nightly"
        task = "reports.nightly"
        cron = "0 2 * * *"
        jitter = "2m"
        max_late = "PT300S"
        tenants = ["acme", "globex"]
        args = [1, "two"]
        kwargs = { format = "pdf" }
        options = { queue = "reports" }

        [[entry]]
        name = "heartbeat"
        task = "ops.heartbeat"
        every = 30
        anchor = "2026-01-01T00:00:10Z"
        """,
    )
    schedule = load_schedule(target)
    nightly, heartbeat = schedule.entries
    assert schedule.namespace == "billing"
    assert nightly.trigger == Cron("0 2 * * *", "Europe/Berlin")
    assert nightly.jitter == timedelta(minutes=2)
    assert nightly.max_late == timedelta(minutes=5)
    assert nightly.tenants == ("acme", "globex")
    assert nightly.args == (1, "two")
    assert nightly.kwargs == {"format": "pdf"}
    assert nightly.options == {"queue": "reports"}
    assert heartbeat.trigger == Every(30, anchor=datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC))


def test_top_level_max_late_and_jitter_apply_only_to_entries_that_do_not_set_them(
    tmp_path: Path,
) -> None:
    target = write(
        tmp_path,
        """
        max_late = "5m"
        jitter = "10s"

        [[entry]]
        name = "inherits"
        task = "t.a"
        every = "1m"

        [[entry]]
        name = "overrides"
        task = "t.b"
        every = "1m"
        jitter = 0
        max_late = "90s"
        """,
    )
    inherits, overrides = load_schedule(target).entries
    assert (inherits.jitter, inherits.max_late) == (timedelta(seconds=10), timedelta(minutes=5))
    assert (overrides.jitter, overrides.max_late) == (timedelta(0), timedelta(seconds=90))


def test_defaults_are_namespace_default_utc_no_jitter_and_a_minute_of_max_late(
    tmp_path: Path,
) -> None:
    target = write(tmp_path, '[[entry]]\nname = "a"\ntask = "t"\ncron = "0 * * * *"\n')
    schedule = load_schedule(target)
    (entry,) = schedule.entries
    assert (schedule.namespace, schedule.timezone) == ("default", "UTC")
    assert entry.trigger == Cron("0 * * * *", "UTC")
    assert (entry.jitter, entry.max_late) == (timedelta(0), timedelta(seconds=60))


def test_a_cron_takes_its_own_zone_and_day_and_over_the_schedule_zone(tmp_path: Path) -> None:
    target = write(
        tmp_path,
        """
        timezone = "Europe/Berlin"
        [[entry]]
        name = "first-monday"
        task = "t"
        cron = "0 6 1-7 * mon"
        timezone = "America/New_York"
        day_and = true
        """,
    )
    (entry,) = load_schedule(target).entries
    assert entry.trigger == Cron("0 6 1-7 * mon", "America/New_York", day_and=True)


@pytest.mark.parametrize("every", ["90s", "PT90S", 90, 90.0])
def test_every_accepts_seconds_compact_and_iso_durations(tmp_path: Path, every: object) -> None:
    value = f'"{every}"' if isinstance(every, str) else str(every)
    target = write(tmp_path, f'[[entry]]\nname = "a"\ntask = "t"\nevery = {value}\n')
    (entry,) = load_schedule(target).entries
    assert entry.trigger == Every(timedelta(seconds=90))


def test_unknown_entry_key_is_named_with_its_entry_and_the_allowed_keys(tmp_path: Path) -> None:
    target = write(tmp_path, '[[entry]]\nname = "a"\ntask = "t"\nevery = 5\ntenant = ["x"]\n')
    (error,) = errors_of(target)
    assert "entry 'a'" in error
    assert "'tenant'" in error
    assert "did you mean 'tenants'" in error
    assert all(key in error for key in ENTRY_KEYS)


def test_unknown_top_level_key_is_an_error(tmp_path: Path) -> None:
    target = write(tmp_path, 'colour = "red"\n[[entry]]\nname = "a"\ntask = "t"\nevery = 5\n')
    (error,) = errors_of(target)
    assert "top level" in error
    assert "'colour'" in error


def test_every_problem_in_the_file_is_reported_at_once(tmp_path: Path) -> None:
    target = write(
        tmp_path,
        """
        [[entry]]
        name = "bad-minute"
        task = "t"
        cron = "61 * * * *"

        [[entry]]
        task = "no-name"
        every = 5

        [[entry]]
        name = "both"
        task = "t"
        every = 5
        cron = "* * * * *"

        [[entry]]
        name = "too-much-jitter"
        task = "t"
        every = "2s"
        jitter = "3s"
        max_late = "10s"

        [[entry]]
        name = "late-before-jitter"
        task = "t"
        every = "1h"
        jitter = "2m"
        max_late = "1m"
        """,
    )
    errors = errors_of(target)
    assert len(errors) == 5
    assert "entry 'bad-minute'" in errors[0]
    assert "bad minute" in errors[0]
    assert "entry #2" in errors[1]
    assert "'name'" in errors[1]
    assert "entry 'both'" in errors[2]
    assert "exactly one of 'cron'" in errors[2]
    assert "entry 'late-before-jitter'" in errors[3]
    assert "max_late" in errors[3]
    assert "entry 'too-much-jitter'" in errors[4]
    assert "half the shortest gap" in errors[4]


def test_wrong_value_types_are_named(tmp_path: Path) -> None:
    target = write(
        tmp_path,
        """
        [[entry]]
        name = "a"
        task = "t"
        every = 5
        tenants = "acme"
        [[entry]]
        name = "b"
        task = "t"
        every = 5
        kwargs = [1]
        [[entry]]
        name = "c"
        task = "t"
        every = "soon"
        [[entry]]
        name = "d"
        task = "t"
        cron = "0 * * * *"
        timezone = "Mars/Olympus"
        [[entry]]
        name = "e"
        task = "t"
        every = 5
        anchor = "2026-01-01T00:00:00"
        """,
    )
    errors = errors_of(target)
    assert [e.split(":")[0] for e in errors] == [f"entry '{n}'" for n in "abcde"]
    assert "'tenants' must be a list" in errors[0]
    assert "'kwargs' must be a table" in errors[1]
    assert "cannot read duration 'soon'" in errors[2]
    assert "unknown time zone 'Mars/Olympus'" in errors[3]
    assert "no UTC offset" in errors[4]


def test_duplicate_entry_names_are_refused(tmp_path: Path) -> None:
    target = write(
        tmp_path,
        '[[entry]]\nname = "a"\ntask = "t"\nevery = 5\n'
        '[[entry]]\nname = "a"\ntask = "u"\nevery = 6\n',
    )
    (error,) = errors_of(target)
    assert "entry 'a': the name is used twice" in error


def test_a_file_with_no_entries_is_refused(tmp_path: Path) -> None:
    (error,) = errors_of(write(tmp_path, 'namespace = "x"\n'))
    assert "no entries" in error


def test_a_missing_file_is_a_config_error_not_a_schedule_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read") as caught:
        load_schedule(str(tmp_path / "absent.toml"))
    assert not isinstance(caught.value, ScheduleError)


def test_invalid_toml_is_a_config_error_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML") as caught:
        load_schedule(write(tmp_path, "x = [\n"))
    assert "\n" not in str(caught.value)


def test_module_target_may_name_a_schedule(module_dir: Path) -> None:
    (module_dir / "sched_mod_a.py").write_text(
        "from beatless import Entry, Every, Schedule\n"
        "schedule = Schedule([Entry(name='a', task='t', trigger=Every(5))], namespace='m')\n"
    )
    schedule = load_schedule("sched_mod_a:schedule")
    assert isinstance(schedule, Schedule)
    assert schedule.namespace == "m"


def test_module_target_may_name_a_list_of_entries(module_dir: Path) -> None:
    (module_dir / "sched_mod_b.py").write_text(
        "from beatless import Cron, Entry, Every\n"
        "entries = [Entry(name='a', task='t', trigger=Every(5)),\n"
        "           Entry(name='b', task='t', trigger=Cron('0 * * * *'))]\n"
    )
    schedule = load_schedule("sched_mod_b:entries")
    assert [e.name for e in schedule.entries] == ["a", "b"]
    assert schedule.entries[1].trigger == Cron("0 * * * *", "UTC")


def test_module_target_that_is_not_a_schedule_is_refused(module_dir: Path) -> None:
    (module_dir / "sched_mod_c.py").write_text("value = 42\n")
    with pytest.raises(ConfigError, match="is a int, not a beatless Schedule"):
        load_schedule("sched_mod_c:value")
    with pytest.raises(ConfigError, match="has no attribute 'missing'"):
        load_schedule("sched_mod_c:missing")


def test_module_that_fails_to_import_is_a_one_line_config_error(module_dir: Path) -> None:
    (module_dir / "sched_mod_d.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="cannot import module 'sched_mod_d': RuntimeError"):
        load_schedule("sched_mod_d:x")
    with pytest.raises(ConfigError, match="No module named"):
        load_schedule("sched_mod_absent:x")


def test_module_whose_schedule_breaks_a_rule_raises_the_schedule_error(module_dir: Path) -> None:
    (module_dir / "sched_mod_e.py").write_text(
        "from beatless import Entry, Every, Schedule\n"
        "s = Schedule([Entry(name='a', task='t', trigger=Every(2), jitter=1.5)])\n"
    )
    with pytest.raises(ScheduleError, match="half the shortest gap"):
        load_schedule("sched_mod_e:s")


def test_a_target_that_is_neither_file_nor_module_is_refused() -> None:
    with pytest.raises(ConfigError, match="give a TOML file path or module:attribute"):
        load_schedule("no-such-thing")


def test_the_toml_and_python_examples_describe_the_same_schedule() -> None:
    from_toml = load_schedule(str(EXAMPLES / "schedule.toml"))
    sys.path.insert(0, str(EXAMPLES))
    try:
        from_python = load_schedule("schedule:schedule")
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop("schedule", None)
    assert from_toml.namespace == from_python.namespace
    assert from_toml.timezone == from_python.timezone
    for a, b in zip(from_toml.entries, from_python.entries, strict=True):
        assert (a.name, a.task, a.trigger, a.args) == (b.name, b.task, b.trigger, b.args)
        assert (a.jitter, a.max_late, a.tenants) == (b.jitter, b.max_late, b.tenants)
        assert (a.kwargs, a.options) == (b.kwargs, b.options)


def test_anchor_may_be_a_toml_offset_date_time_but_not_a_local_one(tmp_path: Path) -> None:
    base = '[[entry]]\nname = "a"\ntask = "t"\nevery = "1h"\n'
    target = write(tmp_path, base + "anchor = 2026-01-01T00:30:00+01:00\n")
    (entry,) = load_schedule(target).entries
    assert entry.trigger == Every("1h", anchor=datetime(2025, 12, 31, 23, 30, tzinfo=UTC))
    (error,) = errors_of(write(tmp_path, base + "anchor = 2026-01-01T00:30:00\n", "local.toml"))
    assert "entry 'a'" in error
    assert "timezone-aware" in error


def test_catch_up_has_a_file_default_an_entry_override_and_names_a_bad_value(
    tmp_path: Path,
) -> None:
    target = write(
        tmp_path,
        """
        catch_up = "all"

        [[entry]]
        name = "inherits"
        task = "t.a"
        every = "1m"

        [[entry]]
        name = "overrides"
        task = "t.b"
        every = "1m"
        catch_up = "none"
        """,
    )
    inherits, overrides = load_schedule(target).entries
    assert (inherits.catch_up, overrides.catch_up) == ("all", "none")
    plain = write(tmp_path, '[[entry]]\nname = "a"\ntask = "t"\nevery = "1m"\n')
    assert load_schedule(plain).entries[0].catch_up == "latest"
    bad = write(tmp_path, 'catch_up = "some"\n[[entry]]\nname = "a"\ntask = "t"\nevery = "1m"\n')
    with pytest.raises(ScheduleError, match="top level: catch_up must be one of"):
        load_schedule(bad)


def test_run_policies_have_file_defaults_entry_overrides_and_named_errors(
    tmp_path: Path,
) -> None:
    target = write(
        tmp_path,
        """
        overlap = "skip"
        run_lease = "1m"
        heartbeat = "10s"

        [[entry]]
        name = "inherits"
        task = "t.a"
        every = "1m"

        [[entry]]
        name = "overrides"
        task = "t.b"
        every = "1m"
        overlap = "allow"
        run_lease = "12s"
        heartbeat = "5s"
        once_only = false
        """,
    )
    inherits, overrides = load_schedule(target).entries
    assert (inherits.overlap, inherits.run_lease, inherits.heartbeat, inherits.once_only) == (
        "skip",
        timedelta(minutes=1),
        timedelta(seconds=10),
        True,
    )
    assert (overrides.overlap, overrides.run_lease, overrides.once_only) == (
        "allow",
        timedelta(seconds=12),
        False,
    )
    bad = write(
        tmp_path,
        'overlap = "buffer_one"\nonce_only = "yes"\n'
        '[[entry]]\nname = "a"\ntask = "t"\nevery = "1m"\nheartbeat = "20s"\n',
    )
    errors = errors_of(bad)
    assert any("overlap 'buffer_one' is not offered" in e for e in errors)
    assert any("once_only must be true or false" in e for e in errors)
    assert any("entry 'a': heartbeat 20s must be under half the run_lease 30s" in e for e in errors)


# -- a table with no problem is built at once, with the same result ---------------------

_RIGHT: dict[str, list[object]] = {
    "jitter": ["1s", "30s"],
    "max_late": ["2m", "1h"],
    "catch_up": ["latest", "all", "none"],
    "overlap": ["allow", "skip"],
    "run_lease": ["30s"],
    "heartbeat": ["5s"],
    "once_only": [True, False],
    "start_at": ["2026-01-01T00:00:00Z"],
    "end_at": ["2031-01-01T00:00:00Z"],
    "enabled": [True, False],
    "tenants": [["acme", "initech"]],
    "args": [[1, "a"], []],
    "kwargs": [{"a": [1]}, {}],
    "options": [{"queue": "q"}],
}
"""The keys a table may have besides its name, task and trigger, with right values."""
_WRONG: list[dict[str, object]] = [
    {"name": ""},
    {"name": 5},
    {"task": ""},
    {"task": 3},
    {"cron": "bad"},
    {"cron": "* * * * *", "every": "1m"},
    {"every": "0s"},
    {"every": "x"},
    {"at": "nope"},
    {"timezone": "Mars/Base"},
    {"day_and": "yes"},
    {"anchor": "x"},
    {"jitter": -1},
    {"jitter": "x"},
    {"jitter": "10m"},
    {"max_late": "x"},
    {"max_late": "1s", "jitter": "30s"},
    {"catch_up": "often"},
    {"overlap": "sideways"},
    {"run_lease": "0s"},
    {"once_only": "no"},
    {"start_at": "later"},
    {"start_at": "2031-01-01T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"},
    {"enabled": 0},
    {"tenants": ["", 1]},
    {"tenants": "acme"},
    {"args": {"a": 1}},
    {"kwargs": [1]},
    {"options": 5},
    {"lat": 52.5},
    {"unknown": 1},
]
"""One problem each, laid over a right table: a table drawn has none or one of them."""
_TRIGGERS = st.one_of(
    st.fixed_dictionaries(
        {"cron": st.sampled_from(["*/5 * * * *", "0 3 * * MON-FRI"])},
        optional={
            "timezone": st.just("Europe/Berlin"),
            "day_and": st.just(True),
        },
    ),
    st.fixed_dictionaries(
        {"every": st.sampled_from(["10s", "1h"])},
        optional={"anchor": st.just("2026-01-01T00:00:00Z")},
    ),
    st.fixed_dictionaries({"at": st.just("2030-01-01T00:00:00Z")}),
)
_TABLES = st.builds(
    lambda name, trigger, rest, wrong: {"name": name, "task": "jobs.t", **trigger, **rest, **wrong},
    st.sampled_from(["nightly", "a/b"]),
    _TRIGGERS,
    st.lists(st.sampled_from(sorted(_RIGHT)), max_size=4, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(_RIGHT[k]) for k in keys})
    ),
    st.one_of(st.just({}), st.sampled_from(_WRONG)),
)
"""A table with no problem, or with one."""


def _outcome(table: dict[str, object]) -> object:
    """What loading one table gives: each entry's fields, or the problems."""
    from beatless.cli.loader import schedule_from_mapping

    data = {"namespace": "n", "timezone": "UTC", "max_late": "5m", "entry": [table]}
    try:
        schedule = schedule_from_mapping(data)
    except (ScheduleError, ConfigError) as exc:
        return ("problems", str(exc))
    return [
        {field: getattr(entry, field) for field in Entry.__dataclass_fields__}
        for entry in schedule.entries
    ]


@given(_TABLES)
@settings(max_examples=500, deadline=None)
def test_a_table_is_read_alike_whether_or_not_it_is_built_at_once(
    table: dict[str, object],
) -> None:
    """A table with no problem is built at once (``_plain_entry``), any other is read by
    the path that names every problem: what the loader gives is the same entry, or the
    same problems, as when every table takes the second path."""
    from beatless.cli import loader

    built_at_once = _outcome(table)
    original = loader._plain_entry
    loader._plain_entry = lambda *_: None  # type: ignore[assignment]
    try:
        read_whole = _outcome(table)
    finally:
        loader._plain_entry = original
    assert built_at_once == read_whole


def test_a_plain_table_is_built_at_once_and_one_with_a_problem_is_not() -> None:
    from beatless.cli.loader import DEFAULTS, _plain_entry

    table = {"name": "a", "task": "t", "cron": "*/5 * * * *", "jitter": "30s", "args": [1]}
    entry = _plain_entry(table, DEFAULTS, "UTC")
    assert entry is not None
    assert (entry.name, entry.task, entry.args) == ("a", "t", (1,))
    assert entry.jitter == timedelta(seconds=30)
    for problem in ({"unknown": 1}, {"task": ""}, {"cron": "bad"}, {"args": {"a": 1}}):
        assert _plain_entry({**table, **problem}, DEFAULTS, "UTC") is None
