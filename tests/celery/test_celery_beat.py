"""The beat scheduler and the shared node factory, on real brokers and real processes."""

from __future__ import annotations

import collections
import importlib.util
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from kombu import Queue

import beatless.celery
from beatless.celery import BeatScheduler, build_scheduler
from beatless.celery._messages import ADDRESS_HEADER, OCCURRENCE_HEADER
from beatless.errors import ScheduleError
from beatless.node.scheduler import Decision
from beatless.schedule.firing import firing_id, from_datetime, iso

REDIS_URL = "redis://127.0.0.1:6379/13"
HAS_ATOMIC = importlib.util.find_spec("beatless.celery._atomic") is not None


def every_second(queue: str, **beatless: Any) -> dict[str, Any]:
    settings = {"max_late": 3, **beatless}
    return {
        "tick": {
            "task": "proj.tick",
            "schedule": 1.0,
            "args": (7,),
            "options": {"queue": queue, "beatless": settings},
        }
    }


def memory_app(queue: str, **conf: Any) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule=every_second(queue),
        beatless_store_url="memory://",
        beatless_namespace=f"ns-{uuid.uuid4().hex[:8]}",
        **conf,
    )
    return app


def drain(app: Celery, queue: str, timeout: float = 2.0) -> list[Any]:
    """Every message in ``queue``, acknowledged; then the queue is deleted."""
    messages = []
    with app.connection_for_read() as connection:
        simple = connection.SimpleQueue(Queue(queue))
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    message = simple.get(timeout=0.2)
                except simple.Empty:
                    if messages:
                        break
                    continue
                message.ack()
                messages.append(message)
        finally:
            simple.close()
            Queue(queue).bind(connection.default_channel).delete()
    return messages


def tick_until_won(scheduler: Any, timeout: float = 4.0) -> list[Decision]:
    won: list[Decision] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not won:
        won = [d for d in scheduler.tick() if d.outcome in ("won", "takeover")]
        time.sleep(0.05)
    return won


# -- in process -----------------------------------------------------------------------


def test_beat_tick_returns_at_most_one_second_and_max_interval() -> None:
    app = memory_app("q-unused")
    beat = BeatScheduler(app=app, max_interval=0.3)
    try:
        waits = [beat.tick() for _ in range(5)]
        assert all(0 <= w <= 0.3 for w in waits)
        beat.max_interval = 300
        assert 0 <= beat.tick() <= 1.0
    finally:
        beat.close()
    assert beat.beatless is None


def test_beat_info_names_the_store_and_path_without_the_password() -> None:
    app = Celery("proj", broker="redis://:hunter2@127.0.0.1:6379/13", set_as_current=False)
    beat = BeatScheduler(app=app, lazy=True)
    assert "redis://:***@127.0.0.1:6379/13" in beat.info
    assert "hunter2" not in beat.info
    assert beat.beatless is None  # lazy: nothing opened


def test_beat_sends_each_firing_with_the_firing_id_as_task_id_and_its_occurrence() -> None:
    queue = f"bltest-{uuid.uuid4().hex[:8]}"
    app = memory_app(queue)
    beat = BeatScheduler(app=app)
    try:
        assert beat.beatless is not None
        won = tick_until_won(beat.beatless)
    finally:
        beat.close()
    assert won
    messages = {m.headers["id"]: m for m in drain(app, queue)}
    for decision in won:
        message = messages[decision.firing.id]
        assert message.headers["task"] == "proj.tick"
        assert message.headers[OCCURRENCE_HEADER] == iso(decision.firing.occurrence_ms)
        assert message.headers[ADDRESS_HEADER] == decision.firing.address
        assert message.decode()[0] == [7]


def test_expires_from_lateness_gives_each_message_the_end_of_its_lateness_budget() -> None:
    queue = f"bltest-{uuid.uuid4().hex[:8]}"
    app = memory_app(queue, beatless_expires_from_lateness=True)
    scheduler = build_scheduler(app)
    try:
        won = tick_until_won(scheduler)
    finally:
        scheduler.close()
    assert won
    messages = {m.headers["id"]: m for m in drain(app, queue)}
    for decision in won:
        expires = datetime.fromisoformat(messages[decision.firing.id].headers["expires"])
        assert expires == decision.firing.occurrence + timedelta(seconds=3)  # max_late 3s


def test_rabbitmq_broker_with_a_redis_store_claims_in_redis_and_sends_with_send_task(
    rabbitmq: str, prefix: str, redis_client: Any
) -> None:
    app = Celery("proj", broker=rabbitmq, set_as_current=False)
    app.conf.update(
        beat_schedule=every_second(prefix),
        beatless_store_url=REDIS_URL,
        beatless_namespace=prefix,
    )
    scheduler = build_scheduler(app, node="rabbit-node")
    try:
        assert scheduler.atomic is None
        assert scheduler.paths == {"tick": (False, "the broker is not Redis")}
        won = tick_until_won(scheduler)
    finally:
        scheduler.close()
    assert won
    ids = {d.firing.id for d in won}
    assert all(redis_client.exists(f"beatless:{prefix}:claim:{i}") for i in ids)
    received = {m.headers["id"]: m.headers for m in drain(app, prefix)}
    assert ids <= set(received)


@pytest.mark.skipif(not HAS_ATOMIC, reason="beatless.celery._atomic is not in this tree")
def test_the_broker_own_redis_takes_the_atomic_path_unless_forced_off(
    prefix: str, redis_client: Any
) -> None:
    def app_with(**conf: Any) -> Celery:
        app = Celery(prefix, broker=REDIS_URL, set_as_current=False)
        app.conf.update(
            beat_schedule={
                **every_second(prefix),
                "topic": {
                    "task": "proj.topic",
                    "schedule": 60,
                    "options": {"exchange": f"{prefix}-topic", "exchange_type": "topic"},
                },
            },
            broker_transport_options={"global_keyprefix": f"{prefix}:"},
            **conf,
        )
        return app

    scheduler = build_scheduler(app_with())
    try:
        assert scheduler.atomic is not None
        assert scheduler.dispatcher is scheduler.atomic
        assert scheduler.paths["tick"][0] is True
        assert scheduler.paths["topic"][0] is False
        won = tick_until_won(scheduler)
    finally:
        scheduler.close()
    assert won
    queued = redis_client.lrange(f"{prefix}:{prefix}", 0, -1)
    assert any(d.firing.id.encode() in raw for d in won for raw in queued)

    forced = build_scheduler(app_with(beatless_force_two_phase=True))
    try:
        assert forced.atomic is None
        assert forced.paths["tick"] == (False, "beatless_force_two_phase is set")
    finally:
        forced.close()


@pytest.mark.skipif(not HAS_ATOMIC, reason="beatless.celery._atomic is not in this tree")
def test_beat_builds_the_messages_due_within_a_second_while_it_would_sleep(
    prefix: str, redis_client: Any
) -> None:
    app = Celery(prefix, broker=REDIS_URL, set_as_current=False)
    app.conf.update(
        beat_schedule=every_second(prefix),
        broker_transport_options={"global_keyprefix": f"{prefix}:"},
        beatless_namespace=prefix,
    )
    beat = BeatScheduler(app=app)
    built: list[str] = []
    won: list[Decision] = []
    try:
        scheduler = beat.beatless
        assert scheduler is not None
        assert scheduler.atomic is not None
        prepare = scheduler.atomic.prepare

        def noting(firings: Any, wake: Any) -> Any:
            built.extend(f.id for f in firings)
            return prepare(firings, wake)

        scheduler.atomic.prepare = noting  # type: ignore[method-assign]
        scheduler.on_decision = won.append
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:  # as celery beat's service drives a scheduler
            interval = beat.tick()
            if interval > 0:
                time.sleep(interval)
    finally:
        beat.close()
    sent = [d.firing.id for d in won if d.outcome == "won"]
    assert len(sent) >= 2
    # Built ahead while beat slept (under celery beat it once never was): on a loaded
    # machine a wake can leave too little of its sleep to build, so not every one need be.
    assert set(sent[1:]) & set(built), f"none of {sent[1:]} was built ahead"


# -- real processes -------------------------------------------------------------------


def test_beats_on_two_hosts_feed_a_worker_each_firing_once_with_its_id_and_occurrence(
    project: Any, redis_client: Any
) -> None:
    schedule = {
        "tick": {
            "task": "beatless_test.record",
            "schedule": 1.0,
            "args": ["tick"],
            "options": {"beatless": {"max_late": 2}},
        },
        "fan": {
            "task": "beatless_test.record",
            "schedule": 2.0,
            "args": ["fan"],
            "options": {"beatless": {"max_late": 3, "jitter": 0.5, "tenants": ["a", "b"]}},
        },
    }
    project.configure(schedule)
    beat_args = ("beat", "-S", "beatless.celery:Scheduler", "-l", "INFO", "--max-interval", "1")
    worker = project.worker("consumer", "-P", "solo")
    beats = [
        project.start(name, *beat_args, "--pidfile", str(project.dir / f"{name}.pid"))
        for name in ("beat-a", "beat-b")
    ]
    try:
        assert project.wait_for(lambda: len(project.runs(redis_client)) >= 12, timeout=20)
    finally:
        for process in beats:
            process.stop()
        worker.stop()
    logs = "\n".join(p.output() for p in (*beats, worker))
    runs = project.runs(redis_client)
    assert runs, logs

    for run in runs:
        occurrence = datetime.fromisoformat(run["occurrence"])
        assert run["header"] == iso(from_datetime(occurrence))
        assert run["id"] == run["firing_id"] == firing_id(run["address"], from_datetime(occurrence))
    per_firing = collections.Counter(r["id"] for r in runs)
    assert max(per_firing.values()) == 1, per_firing
    tenants = {r["address"].rsplit("/", 1)[-1] for r in runs if r["args"] == ["fan"]}
    assert tenants <= {"a", "b"}
    seconds = sorted(
        from_datetime(datetime.fromisoformat(r["occurrence"])) // 1000
        for r in runs
        if r["args"] == ["tick"]
    )
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), seconds
    assert "beatless store" in beats[0].output()
    named = {"beat-a": beats[0], "beat-b": beats[1], "worker": worker}
    assert not (found := tracebacks(named)), found
    assert sum("outcome=won" in p.output() for p in beats) >= 1


def tracebacks(processes: dict[str, Any]) -> str:
    """Each traceback in the processes' logs, whole, with the process and the line before
    it (what logged it): empty when there is none."""
    found = []
    for name, process in processes.items():
        lines = process.output().splitlines()
        for at, line in enumerate(lines):
            if "Traceback" in line:
                end = next(
                    (i for i in range(at + 1, len(lines)) if not lines[i].startswith((" ", "\t"))),
                    len(lines) - 1,
                )
                found.append(f"--- {name}:\n" + "\n".join(lines[max(0, at - 1) : end + 1]))
    return "\n".join(found)


def test_import_of_beatless_celery_opens_no_broker_driver() -> None:
    import subprocess
    import sys

    code = (
        "import sys, beatless.celery; "
        "print(sorted(m for m in ('redis', 'psycopg', 'pika', 'nats') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]"
    assert beatless.celery.BeatScheduler is BeatScheduler


def test_the_first_documented_name_of_the_beat_scheduler_still_loads() -> None:
    from celery.utils.imports import symbol_by_name

    assert symbol_by_name("beatless.celery:Scheduler") is BeatScheduler
    assert symbol_by_name("beatless.celery:BeatScheduler") is BeatScheduler


# -- a schedule with problems ----------------------------------------------------------

BAD_SCHEDULE = {
    "odd": {"task": "proj.work", "schedule": "every day"},
    "tight": {"task": "proj.work", "schedule": 10, "options": {"beatless": {"jitter": 8}}},
}


def test_beat_refuses_a_schedule_with_problems_listing_them_even_in_consume_mode() -> None:
    app = memory_app("q-unused", beatless_on_schedule_error="consume")
    app.conf.beat_schedule = BAD_SCHEDULE
    with pytest.raises(ScheduleError) as caught:
        BeatScheduler(app=app)
    message = str(caught.value)
    assert message.startswith("beatless: 2 problems in the schedule; this node refuses to start")
    assert "entry 'odd': unsupported schedule" in message
    assert "entry 'tight': jitter 8s must be under half" in message
    assert "consume" not in message
    lazy = BeatScheduler(app=app, lazy=True)
    with pytest.raises(ScheduleError):
        lazy.tick()


@pytest.mark.slow
def test_a_beat_process_with_a_bad_schedule_exits_non_zero_with_the_list(project: Any) -> None:
    project.configure(BAD_SCHEDULE)
    beat = project.start(
        "beat-bad",
        "beat",
        "-S",
        "beatless.celery:BeatScheduler",
        "-l",
        "INFO",
        "--pidfile",
        str(project.dir / "beat-bad.pid"),
    )
    try:
        beat.process.wait(30)
    finally:
        code = beat.stop()
    log = beat.output()
    assert code not in (0, None), log
    assert "beatless: 2 problems in the schedule; this node refuses to start" in log
    assert "entry 'odd': unsupported schedule" in log
    assert "entry 'tight': jitter 8s must be under half" in log
