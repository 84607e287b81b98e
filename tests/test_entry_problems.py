"""Every problem of an entry at once: a typo in one option never hides a rule another
option breaks, whatever front end declares the entry (Python, TOML, Celery, Dramatiq)."""

from __future__ import annotations

from pathlib import Path

import pytest

from beatless import Entry, Every
from beatless.cli.loader import load_toml
from beatless.errors import ConfigError, ScheduleError

MAX_LATE_RULE = "max_late 5s must be longer than jitter 20s"


def test_an_entry_reports_a_bad_option_and_the_timing_rule_together() -> None:
    with pytest.raises(ScheduleError) as raised:
        Entry(
            name="x",
            task="t",
            trigger=Every("1m"),
            jitter="20s",
            max_late="5s",
            catch_up="sometimes",
            once_only="yes",  # type: ignore[arg-type]
        )
    errors = raised.value.errors
    assert len(errors) == 3, errors
    assert all(e.startswith("entry 'x': ") for e in errors)
    assert any("catch_up must be one of" in e for e in errors)
    assert any("once_only must be true or false, got 'yes'" in e for e in errors)
    assert any(MAX_LATE_RULE in e for e in errors)


def test_one_problem_is_raised_as_it_always_was() -> None:
    with pytest.raises(ConfigError, match="entry 'x': task must be a non-empty string") as raised:
        Entry(name="x", task="", trigger=Every("1m"))
    assert not isinstance(raised.value, ScheduleError)
    with pytest.raises(ScheduleError, match=MAX_LATE_RULE):
        Entry(name="x", task="t", trigger=Every("1m"), jitter="20s", max_late="5s")


def test_an_unreadable_duration_skips_only_the_rules_that_need_it() -> None:
    with pytest.raises(ScheduleError) as raised:
        Entry(name="x", task="t", trigger=Every("1m"), jitter="soon", max_late=-1)
    errors = raised.value.errors
    assert len(errors) == 2, errors
    assert "jitter" in errors[0]
    assert "max_late must be positive" in errors[1]


def test_a_toml_entry_with_a_typo_still_reports_its_timing_rule(tmp_path: Path) -> None:
    plan = tmp_path / "schedule.toml"
    plan.write_text(
        '[[entry]]\nname = "x"\ntask = "t"\nevery = "1m"\n'
        'jiter = "2m"\njitter = "20s"\nmax_late = "5s"\n'
    )
    with pytest.raises(ScheduleError) as raised:
        load_toml(plan)
    errors = raised.value.errors
    assert len(errors) == 2, errors
    assert "unknown key(s) 'jiter' (did you mean 'jitter'?)" in errors[0]
    assert MAX_LATE_RULE in errors[1]


def test_a_toml_entry_with_a_bad_trigger_still_reports_its_options(tmp_path: Path) -> None:
    plan = tmp_path / "schedule.toml"
    plan.write_text(
        '[[entry]]\nname = "x"\ntask = "t"\ncron = "61 * * * *"\njitter = "20s"\nmax_late = "5s"\n'
    )
    with pytest.raises(ScheduleError) as raised:
        load_toml(plan)
    errors = raised.value.errors
    assert len(errors) == 2, errors
    assert all(e.startswith("entry 'x': ") for e in errors)
    assert MAX_LATE_RULE in errors[1]


def test_a_celery_entry_with_a_typo_still_reports_its_timing_rule() -> None:
    celery = pytest.importorskip("celery", reason="the celery extra")
    from beatless.celery import check_app

    app = celery.Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beatless_store_url="memory://",
        beat_schedule={
            "x": {
                "task": "proj.x",
                "schedule": 60,
                "options": {"beatless": {"jiter": "2m", "jitter": "20s", "max_late": "5s"}},
            },
            "bad-schedule": {
                "task": "proj.y",
                "schedule": "often",
                "options": {"beatless": {"catch_up": "sometimes"}},
            },
        },
    )
    problems = check_app(app).problems
    assert len(problems) == 4, problems
    x = [p for p in problems if p.startswith("entry 'x': ")]
    assert "unknown beatless setting(s) 'jiter' (did you mean 'jitter'?)" in x[0]
    assert MAX_LATE_RULE in x[1]
    bad = [p for p in problems if p.startswith("entry 'bad-schedule': ")]
    assert "unsupported schedule 'often'" in bad[0]
    assert "catch_up must be one of" in bad[1]


def test_a_dramatiq_declaration_with_a_bad_trigger_still_reports_its_timing_rule() -> None:
    pytest.importorskip("dramatiq", reason="the dramatiq extra")
    from beatless.dramatiq import cron

    declared = cron("61 * * * *", jitter="20s", max_late="5s")
    with pytest.raises(ScheduleError) as raised:
        declared.entry("actor")
    errors = raised.value.errors
    assert len(errors) == 2, errors
    assert all(e.startswith("entry 'actor': ") for e in errors)
    assert MAX_LATE_RULE in errors[1]


@pytest.mark.parametrize(
    ("option", "bad", "said"),
    [
        ("jitter", "wide", "jitter"),
        ("max_late", "soon", "max_late"),
        ("catch_up", "some", "catch_up must be one of 'latest', 'all', 'none', got 'some'"),
        ("overlap", "queue", "overlap must be one of 'allow', 'skip', got 'queue'"),
        ("run_lease", "long", "run_lease"),
        ("heartbeat", "often", "heartbeat"),
        ("once_only", "yes", "once_only must be true or false, got 'yes'"),
    ],
)
def test_each_option_is_read_and_refused_alike_by_the_entry_the_toml_file_and_celery(
    option: str, bad: str, said: str
) -> None:
    """One definition of each option (beatless.schedule.options): the same value is
    refused with the same words wherever it is given, each naming where it came from."""
    from celery import Celery

    from beatless.celery._settings import CelerySettings
    from beatless.cli.loader import schedule_from_mapping
    from beatless.schedule.options import NAMES

    assert option in NAMES
    with pytest.raises(ConfigError) as by_entry:
        Entry(name="e", task="t", trigger=Every(60), **{option: bad})
    table = {"name": "e", "task": "t", "every": "60s", option: bad}
    with pytest.raises(ScheduleError) as by_top:
        schedule_from_mapping({option: bad, "entry": [table]})
    app = Celery("options", broker="memory://", set_as_current=False)
    app.conf.update({f"beatless_{option}": bad, "beatless_store_url": "memory://"})
    with pytest.raises(ScheduleError) as by_celery:
        CelerySettings.from_app(app)
    assert f"entry 'e': {said}" in str(by_entry.value)
    assert any(e.startswith(f"top level: {said}") for e in by_top.value.errors), by_top
    assert any(e.startswith(f"entry 'e': {said}") for e in by_top.value.errors), by_top
    assert any(e.startswith(f"beatless_{said}") for e in by_celery.value.errors), by_celery
