"""The worker bootstep: one scheduler per worker node, in real ``celery worker`` processes."""

from __future__ import annotations

import collections
import re
from datetime import datetime
from typing import Any

import click
from celery import Celery

import beatless.celery
from beatless.celery import Beatless, install
from beatless.celery.worker import DISABLE_OPTION
from beatless.firing import firing_id, from_datetime

WON = re.compile(r"firing (\S+) entry=(\S+) .* outcome=(won|takeover)")


def test_install_adds_the_step_and_the_worker_option_once() -> None:
    app = Celery("proj", set_as_current=False)
    install(app)
    install(app)
    assert [s for s in app.steps["worker"] if s is Beatless] == [Beatless]
    options = [o for o in app.user_options["worker"] if DISABLE_OPTION in o.opts]
    assert len(options) == 1
    assert isinstance(options[0], click.Option)
    assert options[0].is_flag
    assert beatless.celery.Beatless.requires == ("celery.worker.components:Pool",)


def test_the_step_is_left_out_of_a_worker_started_without_beatless() -> None:
    app = Celery("proj", set_as_current=False)
    install(app)
    assert Beatless(object(), without_beatless=True).include_if(object()) is False
    assert Beatless(object()).include_if(object()) is True


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
        assert "two-phase: tick (the claim store is not the broker's Redis)" in log, log
    won = [m.group(1) for log in logs for m in WON.finditer(log)]
    assert len(won) == len(set(won))
    assert set(per_firing) <= set(won)


def _delete_rabbitmq_queue(url: str, name: str) -> None:
    from kombu import Connection, Exchange, Queue

    with Connection(url) as connection:
        channel = connection.default_channel
        Queue(name).bind(channel).delete()
        Exchange(name).bind(channel).delete()
