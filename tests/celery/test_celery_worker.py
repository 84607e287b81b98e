"""The worker bootstep: one scheduler per worker node, in real ``celery worker`` processes."""

from __future__ import annotations

import collections
import logging
import re
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import click
import pytest
from celery import Celery
from celery.exceptions import WorkerShutdown

import beatless.celery
from beatless.celery import BeatlessStep, install
from beatless.celery._schedule import check_app
from beatless.celery._worker import DISABLE_OPTION, StartRefused
from beatless.cli import command as cli
from beatless.errors import ConfigError
from beatless.fleet._notes import drift
from beatless.schedule.firing import firing_id, from_datetime
from beatless.schedule.problems import EXIT_REFUSED

WON = re.compile(r"firing (\S+) entry=(\S+) .* outcome=(won|takeover)")


def test_install_adds_the_step_and_the_worker_option_once() -> None:
    app = Celery("proj", set_as_current=False)
    install(app)
    install(app)
    assert [s for s in app.steps["worker"] if s is BeatlessStep] == [BeatlessStep]
    options = [o for o in app.user_options["worker"] if DISABLE_OPTION in o.opts]
    assert len(options) == 1
    assert isinstance(options[0], click.Option)
    assert options[0].is_flag
    assert beatless.celery.BeatlessStep.requires == ("celery.worker.components:Pool",)


def test_the_step_is_left_out_of_a_worker_started_without_beatless() -> None:
    app = Celery("proj", set_as_current=False)
    install(app)
    assert BeatlessStep(object(), without_beatless=True).include_if(object()) is False
    assert BeatlessStep(object()).include_if(object()) is True


# -- a schedule with problems ----------------------------------------------------------

BAD_SCHEDULE = {
    "odd": {"task": "proj.work", "schedule": "every day"},
    "tight": {"task": "proj.work", "schedule": 10, "options": {"beatless": {"jitter": 8}}},
    "opaque": {"task": "proj.work", "schedule": 60, "args": [{1, 2}]},
}


def bad_app(**conf: Any) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(beat_schedule=BAD_SCHEDULE, beatless_store_url="memory://", **conf)
    return app


def test_the_step_refuses_to_start_with_one_error_listing_every_problem(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = SimpleNamespace(app=bad_app(), hostname="w1@host")
    step = BeatlessStep(worker)
    with caplog.at_level(logging.INFO, logger="beatless"), pytest.raises(StartRefused) as caught:
        step.start(worker)
    # A SystemExit is Celery's clean stop: no "Unrecoverable error" and no traceback.
    assert isinstance(caught.value, WorkerShutdown)
    assert not isinstance(caught.value, Exception)
    assert caught.value.code == EXIT_REFUSED
    message = caught.value.reason
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [message]
    assert message.startswith("beatless: 3 problems in the schedule; this node refuses to start")
    for name in ("odd", "tight", "opaque"):
        assert f"\n  entry '{name}': " in message
    assert "args[0] (a set) cannot be encoded as JSON" in message
    assert 'app.conf.beatless_on_schedule_error = "consume"' in message
    assert step.scheduler is None


def test_in_consume_mode_the_step_schedules_nothing_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = SimpleNamespace(app=bad_app(beatless_on_schedule_error="consume"), hostname="w")
    step = BeatlessStep(worker)
    with caplog.at_level(logging.INFO, logger="beatless"):
        step.start(worker)
        step.start(worker)
    assert step.scheduler is None
    assert len(step.schedule_problems) == 3
    assert all(p.startswith("entry '") for p in step.schedule_problems)
    (said,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert said.levelno == logging.ERROR
    assert "This node schedules nothing: it consumes tasks only" in said.getMessage()
    assert all(p in said.getMessage() for p in step.schedule_problems)
    step.stop(worker)


def test_in_consume_mode_only_the_bad_entries_are_left_out_each_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = bad_app(beatless_on_schedule_error="consume")
    app.conf.beat_schedule = {**BAD_SCHEDULE, "tick": {"task": "proj.work", "schedule": 60}}
    worker = SimpleNamespace(app=app, hostname="w")
    step = BeatlessStep(worker)
    with caplog.at_level(logging.INFO, logger="beatless"):
        step.start(worker)
    try:
        assert step.scheduler is not None
        assert [e.name for e in step.scheduler.schedule.entries] == ["tick"]
        assert len(step.schedule_problems) == 3
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        for name in ("odd", "tight", "opaque"):
            (line,) = [m for m in said if m.startswith(f"beatless: entry {name!r} is left out")]
            assert "the 1 other entry are scheduled" not in line
            assert "; the 1 other entr" in line
            assert all(p in line for p in step.schedule_problems if f"entry {name!r}" in p)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        record = step.scheduler.board.node_record(step.scheduler.now_ms())
        assert record.left_out == "odd,opaque,tight"  # refused when read, then by a timing rule
        assert drift([record]) == [
            f"node {record.node}: entries left out of its schedule, each with a problem "
            "(`beatless check` lists them): odd,opaque,tight"
        ]
    finally:
        step.stop(worker)


@pytest.mark.parametrize(
    "conf",
    [
        {"beat_scheduler": "django_celery_beat.schedulers:DatabaseScheduler"},
        {"beatless_jitter": "soon"},
    ],
)
def test_in_consume_mode_a_problem_of_the_whole_schedule_schedules_nothing(
    conf: dict[str, Any],
) -> None:
    app = bad_app(beatless_on_schedule_error="consume", **conf)
    app.conf.beat_schedule = {**BAD_SCHEDULE, "tick": {"task": "proj.work", "schedule": 60}}
    found = check_app(app)
    assert found.usable is None
    worker = SimpleNamespace(app=app, hostname="w")
    step = BeatlessStep(worker)
    step.start(worker)
    assert step.scheduler is None
    assert step.schedule_problems


def check_module(
    tmp_path: Any, monkeypatch: Any, capsys: pytest.CaptureFixture[str], name: str, line: str
) -> tuple[int, str, str]:
    """``beatless check --celery`` of a module whose app has ``line`` configured."""
    (tmp_path / f"{name}.py").write_text(
        "from celery import Celery\n"
        "app = Celery('proj', broker='memory://')\n"
        "app.conf.beatless_store_url = 'memory://'\n" + line + "\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["check", "--celery", f"{name}:app"])
    out, err = capsys.readouterr()
    return code, out, err


def test_beatless_check_says_which_entries_a_consuming_node_leaves_out(
    tmp_path: Any, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = check_module(
        tmp_path,
        monkeypatch,
        capsys,
        "bt_partial_app",
        "app.conf.beat_schedule = {'tick': {'task': 'proj.work', 'schedule': 60}, "
        "'odd': {'task': 'proj.work', 'schedule': 'every day'}}",
    )
    assert code == 1
    assert "bt_partial_app:app: 1 problem(s)" in err
    assert "entry 'odd': unsupported schedule" in err
    assert (
        "with on_schedule_error = 'consume', a node schedules the 1 other entry and leaves "
        "out 'odd'"
    ) in err


def test_a_bad_on_schedule_error_setting_stops_the_worker_whatever_the_schedule() -> None:
    worker = SimpleNamespace(app=bad_app(beatless_on_schedule_error="ignore"), hostname="w")
    with pytest.raises(ConfigError, match="beatless_on_schedule_error must be 'refuse'"):
        BeatlessStep(worker).start(worker)


def test_a_sound_schedule_starts_the_scheduler_and_warns_of_unregistered_tasks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule={"hourly": {"task": "proj.nowhere", "schedule": 3600}},
        beatless_store_url="memory://",
    )
    worker = SimpleNamespace(app=app, hostname="w")
    step = BeatlessStep(worker)
    with caplog.at_level(logging.WARNING, logger="beatless"):
        step.start(worker)
    try:
        assert step.scheduler is not None
        assert step.schedule_problems == ()
    finally:
        step.stop(worker)
    assert "entry 'hourly': task 'proj.nowhere' is not registered" in caplog.text


# -- a claim store that cannot be used at start ----------------------------------------


def store_app(store_url: str, **conf: Any) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule={"tick": {"task": "proj.work", "schedule": 60}},
        beatless_store_url=store_url,
        **conf,
    )
    app.task(name="proj.work")(_work)
    return app


def _work() -> None:
    pass


REFUSING = "redis://nobody:s3cret@127.0.0.1:6379/13"
"""A user the Redis server does not know: it refuses the credentials at once."""
UNREACHABLE = "redis://:s3cret@127.0.0.1:1/13"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (REFUSING, "redis store redis://nobody:***@127.0.0.1:6379/13: cannot probe: "),
        (UNREACHABLE, "redis store redis://:***@127.0.0.1:1/13: cannot probe: "),
    ],
)
def test_a_store_that_refuses_or_cannot_be_reached_stops_the_worker_with_one_line_naming_it(
    url: str, said: str, require: Any, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    require("Redis", "127.0.0.1", 6379)
    monkeypatch.setattr("beatless.stores.PROBE_WAIT_S", 0.3)
    worker = SimpleNamespace(app=store_app(url), hostname="w1@host")
    step = BeatlessStep(worker)
    with caplog.at_level(logging.INFO, logger="beatless"), pytest.raises(StartRefused) as caught:
        step.start(worker)
    reason = caught.value.reason
    assert caught.value.code == EXIT_REFUSED
    assert reason.startswith(
        "beatless: this node refuses to start: its claim store cannot be used: "
    )
    assert said in reason
    assert "\n" not in reason
    assert "s3cret" not in reason
    assert "broker" not in reason
    assert 'app.conf.beatless_on_schedule_error = "consume"' in reason
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [reason]
    assert step.scheduler is None


def test_in_consume_mode_a_store_that_refuses_is_one_error_and_a_problem_of_the_node(
    require: Any, caplog: pytest.LogCaptureFixture
) -> None:
    require("Redis", "127.0.0.1", 6379)
    app = store_app(REFUSING, beatless_on_schedule_error="consume")
    worker = SimpleNamespace(app=app, hostname="w1@host")
    step = BeatlessStep(worker)
    with caplog.at_level(logging.INFO, logger="beatless"):
        step.start(worker)
        step.start(worker)
    assert step.scheduler is None
    (problem,) = step.schedule_problems
    assert problem.startswith("redis store redis://nobody:***@127.0.0.1:6379/13: cannot probe: ")
    (said,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert said.levelno == logging.ERROR
    assert said.getMessage().startswith(f"beatless: the claim store cannot be used: {problem}")
    assert "this node schedules nothing" in said.getMessage()
    assert "s3cret" not in caplog.text


# -- a schedule that lives elsewhere ------------------------------------------------------


class _RedBeat:
    """Stands for RedBeat's class, given as the class rather than by name."""


_RedBeat.__module__, _RedBeat.__qualname__ = "redbeat.schedulers", "RedBeatScheduler"
DATABASE_SCHEDULER = "django-celery-beat's DatabaseScheduler"


@pytest.mark.parametrize(
    ("scheduler", "said"),
    [
        (
            "django_celery_beat.schedulers:DatabaseScheduler",
            "django-celery-beat's DatabaseScheduler",
        ),
        (
            "django_celery_beat.schedulers.DatabaseScheduler",
            "django-celery-beat's DatabaseScheduler",
        ),
        ("django", "django-celery-beat's DatabaseScheduler"),
        ("redbeat.RedBeatScheduler", "RedBeat's RedBeatScheduler"),
        ("redbeat.schedulers:RedBeatScheduler", "RedBeat's RedBeatScheduler"),
        (_RedBeat, "RedBeat's RedBeatScheduler"),
    ],
)
def test_a_beat_scheduler_whose_schedule_lives_elsewhere_is_named_at_check_and_start(
    scheduler: Any, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = store_app("memory://", beat_scheduler=scheduler)
    found = check_app(app)
    assert found.schedule is None
    (problem,) = found.problems
    assert f"is {said}: its schedule lives " in problem
    assert "beatless does not load it" in problem
    assert "beat_schedule (1 entry here)" in problem
    assert "docs/migrating-from-beat.md" in problem
    if "django" in said:  # what moves the schedule over, and its guide
        assert "turn on the django-celery-beat bridge (app.conf.beatless_django = True" in problem
        assert "docs/migrating-from-django-celery-beat.md" in problem
    else:
        assert "`beatless schedule import --from redbeat://HOST:PORT/DB`" in problem
        assert "docs/migrating-from-redbeat.md" in problem
    assert "remove the beat_scheduler setting and stop celery beat" in problem
    worker = SimpleNamespace(app=app, hostname="w")
    with caplog.at_level(logging.INFO, logger="beatless"), pytest.raises(StartRefused) as caught:
        BeatlessStep(worker).start(worker)
    assert problem in caught.value.reason


@pytest.mark.parametrize(
    "scheduler", [None, "beatless.celery:BeatScheduler", "celery.beat:PersistentScheduler"]
)
def test_other_beat_schedulers_are_not_taken_for_a_schedule_elsewhere(scheduler: Any) -> None:
    assert check_app(store_app("memory://", beat_scheduler=scheduler)).is_sound


def test_beatless_check_says_the_schedule_lives_in_the_database_not_sound_with_0_entries(
    tmp_path: Any, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = check_module(
        tmp_path,
        monkeypatch,
        capsys,
        "bt_django_app",
        "app.conf.beat_scheduler = 'django_celery_beat.schedulers:DatabaseScheduler'",
    )
    assert code == 1
    assert "sound" not in out
    assert "bt_django_app:app: 1 problem(s)" in err
    assert "its schedule lives in the database" in err


@pytest.mark.slow
def test_a_worker_with_a_bad_schedule_exits_non_zero_before_consuming_with_the_list(
    project: Any, redis_client: Any
) -> None:
    project.configure(
        {
            "tick": {"task": "beatless_test.record", "schedule": 1.0, "args": ["tick"]},
            "odd": {"task": "beatless_test.record", "schedule": "every day"},
            "tight": {
                "task": "beatless_test.record",
                "schedule": 10,
                "options": {"beatless": {"jitter": 8}},
            },
        }
    )
    node = project.worker("refuses", "-P", "solo", install=True)
    try:
        node.process.wait(30)
    finally:
        code = node.stop()
    log = node.output()
    assert code == EXIT_REFUSED, log
    assert "beatless: 2 problems in the schedule; this node refuses to start" in log
    assert "Traceback" not in log
    assert "Unrecoverable error" not in log
    assert "entry 'odd': unsupported schedule" in log
    assert "entry 'tight': jitter 8s must be under half" in log
    assert "beatless node" not in log
    assert project.runs(redis_client) == []


@pytest.mark.slow
def test_a_worker_whose_store_refuses_its_password_exits_with_one_line_naming_the_store(
    project: Any, redis_client: Any
) -> None:
    project.configure(
        {"tick": {"task": "beatless_test.record", "schedule": 1.0, "args": ["tick"]}},
        beatless_store_url=REFUSING,
    )
    node = project.worker("refused", "-P", "solo", install=True)
    try:
        node.process.wait(30)
    finally:
        code = node.stop()
    log = node.output()
    assert code == EXIT_REFUSED, log
    (line,) = [line for line in log.splitlines() if "CRITICAL" in line]
    assert (
        "beatless: this node refuses to start: its claim store cannot be used: redis store " in line
    )
    assert "redis://nobody:***@127.0.0.1:6379/13" in line
    assert "s3cret" not in log
    assert "Traceback" not in log
    assert "broker did not answer" not in log
    assert " ready." not in log
    assert project.runs(redis_client) == []


@pytest.mark.slow
def test_a_worker_in_consume_mode_schedules_the_sound_entries_and_names_the_one_left_out(
    project: Any, redis_client: Any
) -> None:
    project.configure(
        {
            "tick": {"task": "beatless_test.record", "schedule": 1.0, "args": ["tick"]},
            "odd": {"task": "beatless_test.record", "schedule": "every day"},
        },
        beatless_on_schedule_error="consume",
    )
    node = project.worker("consumes", "-P", "solo", install=True)
    try:
        assert project.wait_for(lambda: "ready." in node.output(), timeout=30), node.output()
        _send_record(project, "by hand")
        assert project.wait_for(
            lambda: {"by hand", "tick"} <= {r["args"][0] for r in project.runs(redis_client)},
            timeout=15,
        ), node.output()
    finally:
        code = node.stop()
    log = node.output()
    assert code == 0, log
    assert "This node schedules nothing" not in log
    assert log.count("beatless: entry 'odd' is left out of this node's schedule") == 1, log
    assert "entry 'odd': unsupported schedule" in log
    assert "the 1 other entry is scheduled" in log


def _send_record(project: Any, *args: str) -> None:
    app = Celery(project.prefix, broker=project.env["BT_BROKER"], set_as_current=False)
    app.conf.update(
        broker_transport_options={"global_keyprefix": project.prefix + ":"},
        task_default_queue=project.prefix,
    )
    try:
        app.send_task("beatless_test.record", args=list(args))
    finally:
        app.close()


def test_worker_nodes_fire_a_one_second_entry_exactly_once_per_occurrence(
    project: Any, redis_client: Any
) -> None:
    project.configure(
        {
            "tick": {
                "task": "beatless_test.record",
                "schedule": 1.0,
                "args": ["tick"],
                "options": {"beatless": {"max_late": 2}},
            }
        }
    )
    nodes = {
        "prefork": project.worker("prefork", "-P", "prefork", "-c", "2", install=True),
        "threads": project.worker("threads", "-P", "threads", "-c", "2", install=True),
        "solo": project.worker("solo", "-P", "solo", install=True),
        "off": project.worker("off", "-P", "solo", DISABLE_OPTION, install=True),
    }
    try:
        assert project.wait_for(lambda: len(project.runs(redis_client)) >= 8, timeout=25)
    finally:
        codes = {name: process.stop() for name, process in nodes.items()}
    logs = {name: process.output() for name, process in nodes.items()}
    runs = project.runs(redis_client)

    per_firing = collections.Counter(r["id"] for r in runs)
    assert max(per_firing.values()) == 1, per_firing
    seconds = sorted(from_datetime(datetime.fromisoformat(r["occurrence"])) // 1000 for r in runs)
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), seconds
    for run in runs:
        occurrence = from_datetime(datetime.fromisoformat(run["occurrence"]))
        assert run["id"] == firing_id(run["address"], occurrence)

    won = [m.group(1) for log in logs.values() for m in WON.finditer(log)]
    assert len(won) == len(set(won)), "a firing was won twice"
    assert set(per_firing) <= set(won)
    assert codes == dict.fromkeys(nodes, 0), logs
    for name in ("prefork", "threads", "solo"):
        started = re.findall(r"INFO/(\w+)\] beatless node (\S+):", logs[name])
        assert len(started) == 1, logs[name]
        process, node = started[0]
        assert process == "MainProcess"
        assert node.startswith(f"{name}@")
        assert re.search(r":\d+$", node)
        assert f"node {node} stopped" in logs[name], logs[name]
    assert "beatless is off on this node" in logs["off"]
    assert "beatless node" not in logs["off"]
    assert "outcome=" not in logs["off"]


def test_workers_on_rabbitmq_claim_in_redis_and_enqueue_through_send_task(
    project: Any, redis_client: Any, rabbitmq: str
) -> None:
    project.env["BT_BROKER"] = rabbitmq
    project.configure(
        {
            "tick": {
                "task": "beatless_test.record",
                "schedule": 1.0,
                "args": ["tick"],
                "options": {"beatless": {"max_late": 2}},
            }
        },
        beatless_store_url="redis://127.0.0.1:6379/13",
    )
    nodes = [project.worker(name, "-P", "solo", install=True) for name in ("r1", "r2")]
    try:
        assert project.wait_for(lambda: len(project.runs(redis_client)) >= 5, timeout=20)
    finally:
        for process in nodes:
            process.stop()
        _delete_rabbitmq_queue(rabbitmq, project.prefix)
    logs = [process.output() for process in nodes]
    runs = project.runs(redis_client)
    per_firing = collections.Counter(r["id"] for r in runs)
    assert max(per_firing.values()) == 1, per_firing
    for run in runs:
        occurrence = from_datetime(datetime.fromisoformat(run["occurrence"]))
        assert run["id"] == firing_id(run["address"], occurrence)
    for log in logs:
        assert "two-phase: 'tick' (the broker is not Redis)" in log, log
    won = [m.group(1) for log in logs for m in WON.finditer(log)]
    assert len(won) == len(set(won))
    assert set(per_firing) <= set(won)


def _delete_rabbitmq_queue(url: str, name: str) -> None:
    from kombu import Connection, Exchange, Queue

    with Connection(url) as connection:
        channel = connection.default_channel
        Queue(name).bind(channel).delete()
        Exchange(name).bind(channel).delete()
