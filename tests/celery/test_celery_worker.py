"""The worker bootstep: one scheduler per worker node, in real ``celery worker`` processes."""

from __future__ import annotations

import collections
import logging
import re
import time
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import click
import pytest
from celery import Celery

import beatless.celery
from beatless.celery import BeatlessStep, install
from beatless.celery.worker import DISABLE_OPTION
from beatless.errors import ConfigError, ScheduleError
from beatless.firing import firing_id, from_datetime

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


def test_the_step_refuses_to_start_with_one_error_listing_every_problem() -> None:
    worker = SimpleNamespace(app=bad_app(), hostname="w1@host")
    step = BeatlessStep(worker)
    with pytest.raises(ScheduleError) as caught:
        step.start(worker)
    message = str(caught.value)
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
    assert code not in (0, None), log
    assert "beatless: 2 problems in the schedule; this node refuses to start" in log
    assert "entry 'odd': unsupported schedule" in log
    assert "entry 'tight': jitter 8s must be under half" in log
    assert "beatless node" not in log
    assert project.runs(redis_client) == []


@pytest.mark.slow
def test_a_worker_in_consume_mode_runs_tasks_and_schedules_nothing(
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
        assert project.wait_for(lambda: len(project.runs(redis_client)) >= 1, timeout=15)
        time.sleep(2)  # a scheduling node would have fired 'tick' by now
    finally:
        code = node.stop()
    log = node.output()
    assert code == 0, log
    assert [r["args"] for r in project.runs(redis_client)] == [["by hand"]]
    assert log.count("This node schedules nothing") == 1, log
    assert "entry 'odd': unsupported schedule" in log
    assert "beatless node" not in log


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
