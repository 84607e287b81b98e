"""The Dramatiq middleware on a StubBroker: declarations, messages, where it runs."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage
from stores import ManualClock

import beatless.dramatiq as bd
from beatless import ConfigError, Entry, Every, ScheduleError, StoreError
from beatless.dramatiq import fork
from beatless.firing import Firing, firing_id
from beatless.stores import MemoryStore
from beatless.stores.base import ClaimRequest, Outcome


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000.0)


@pytest.fixture
def broker(clock: ManualClock) -> Iterator[StubBroker]:
    stub = StubBroker()
    stub.add_middleware(CurrentMessage())
    stub.add_middleware(bd.Beatless(store=MemoryStore(clock=clock), namespace="unit", clock=clock))
    yield stub
    stub.close()


def middleware(broker: dramatiq.Broker) -> bd.Beatless:
    (found,) = [m for m in broker.middleware if isinstance(m, bd.Beatless)]
    return found


# -- declarations ---------------------------------------------------------------------------


def test_periodic_option_is_refused_without_the_middleware_as_dramatiq_refuses_any() -> None:
    bare = StubBroker()
    with pytest.raises(ValueError, match="actor options are undefined: periodic"):
        dramatiq.actor(lambda: None, broker=bare, periodic=bd.every("1m"))


def test_a_jitter_too_wide_for_the_trigger_fails_where_it_is_declared() -> None:
    with pytest.raises(ScheduleError, match=r"jitter 6s must be under half .* at most 4s999ms"):
        bd.every("10s", jitter="6s")
    with pytest.raises(ScheduleError, match="jitter 40s must be under half"):
        bd.cron("* * * * *", jitter="40s")


def test_bad_durations_and_expressions_fail_where_they_are_declared() -> None:
    with pytest.raises(ConfigError, match="cannot read duration '2 minutes'"):
        bd.cron("0 2 * * *", jitter="2 minutes")
    with pytest.raises(ScheduleError, match="cron '61 \\* \\* \\* \\*'"):
        bd.cron("61 * * * *")
    with pytest.raises(ScheduleError, match="max_late 1m must be longer than jitter 2m"):
        bd.cron("0 2 * * *", jitter="2m", max_late="1m")


def test_schedule_gathers_periodic_actors_and_entries_with_the_middleware_defaults(
    clock: ManualClock,
) -> None:
    stub = StubBroker()
    beat = bd.Beatless(
        store="memory://",
        namespace="app",
        timezone="Europe/Berlin",
        jitter="5s",
        max_late="2m",
        entries=[Entry(name="ping-hourly", task="ping", trigger=Every("1h"))],
    )
    stub.add_middleware(beat)
    dramatiq.actor(lambda: None, actor_name="ping", broker=stub)
    dramatiq.actor(lambda: None, actor_name="report", broker=stub, periodic=bd.cron("0 2 * * *"))
    dramatiq.actor(
        lambda: None,
        actor_name="sync",
        broker=stub,
        periodic=[bd.every("30s", name="sync-fast", jitter=0), bd.every("1h", name="sync-slow")],
    )
    schedule = beat.schedule(stub)
    by_name = {e.name: e for e in schedule.entries}
    assert set(by_name) == {"ping-hourly", "report", "sync-fast", "sync-slow"}
    assert by_name["report"].trigger.describe() == "cron '0 2 * * *' in Europe/Berlin"
    assert str(by_name["report"].jitter) == "0:00:05"
    assert str(by_name["report"].max_late) == "0:02:00"
    assert by_name["sync-fast"].jitter_ms == 0
    assert by_name["sync-slow"].task == "sync"


def test_several_declarations_on_one_actor_must_be_named_apart(broker: StubBroker) -> None:
    dramatiq.actor(
        lambda: None,
        actor_name="twice",
        broker=broker,
        periodic=[bd.every("1m"), bd.every("1h")],
    )
    with pytest.raises(ConfigError, match="give each one a name"):
        middleware(broker).schedule(broker)


def test_a_periodic_option_that_is_not_a_declaration_is_refused(broker: StubBroker) -> None:
    dramatiq.actor(lambda: None, actor_name="odd", broker=broker, periodic="*/5 * * * *")
    with pytest.raises(ConfigError, match=r"takes cron\(\.\.\.\), every\(\.\.\.\)"):
        middleware(broker).schedule(broker)


def test_an_entry_for_an_actor_that_does_not_exist_is_refused() -> None:
    stub = StubBroker()
    entry = Entry(name="ghost", task="nobody", trigger=Every(60))
    stub.add_middleware(bd.Beatless(store="memory://", entries=[entry]))
    with pytest.raises(ConfigError, match="task 'nobody' is not an actor of this broker"):
        middleware(stub).schedule(stub)


# -- messages -------------------------------------------------------------------------------


def test_the_message_id_is_the_firing_id_and_the_timestamp_its_occurrence(
    broker: StubBroker,
) -> None:
    actor = dramatiq.actor(lambda tenant: None, actor_name="fan", broker=broker, queue_name="q")
    entry = Entry(name="fan", task="fan", trigger=Every(60), args=[1], options={"max_age": 5_000})
    firing = Firing.of(entry, "acme", "unit/fan/acme", 1_800_000_000_000)
    message = bd.message_for(firing, actor, tenant_kwarg="tenant")
    assert message.message_id == firing_id("unit/fan/acme", 1_800_000_000_000)
    assert message.message_timestamp == 1_800_000_000_000
    assert (message.queue_name, message.actor_name) == ("q", "fan")
    assert message.args == (1,)
    assert message.kwargs == {"tenant": "acme"}
    assert message.options["max_age"] == 5_000
    assert message.options[bd.OCCURRENCE_OPTION] == 1_800_000_000_000
    assert bd.occurrence(message) == datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
    assert bd.tenant(message) == "acme"
    without = bd.message_for(firing, actor, tenant_kwarg=None)
    assert without.kwargs == {}
    assert without.options[bd.TENANT_OPTION] == "acme"


def test_occurrence_reads_the_current_message_and_is_none_for_other_messages(
    broker: StubBroker,
) -> None:
    actor = dramatiq.actor(lambda: None, actor_name="plain", broker=broker)
    with pytest.raises(ConfigError, match="CurrentMessage"):
        bd.occurrence()
    message = actor.message()
    CurrentMessage().before_process_message(broker, message)
    try:
        assert bd.occurrence() is None
        assert bd.tenant() is None
    finally:
        CurrentMessage().after_process_message(broker, message)


# -- a StubBroker and the memory store, as in a user's unit test --------------------------------


def test_a_stub_broker_runs_a_periodic_actor_with_its_occurrence(
    broker: StubBroker, clock: ManualClock
) -> None:
    seen: list[Any] = []

    def report() -> None:
        seen.append((bd.occurrence(), CurrentMessage.get_current_message().message_id))  # type: ignore[union-attr]

    dramatiq.actor(report, broker=broker, periodic=bd.every("1m"))
    scheduler = middleware(broker).scheduler(broker)
    clock.advance(30_000)
    decisions = scheduler.tick()
    assert [d.outcome for d in decisions] == ["won"]
    worker = Worker(broker, worker_timeout=50)
    worker.start()
    try:
        broker.join("default", timeout=5_000)
        worker.join()
    finally:
        worker.stop()
    (firing,) = [d.firing for d in decisions]
    assert seen == [(firing.occurrence, firing.id)]


def test_two_nodes_on_one_memory_store_enqueue_each_firing_once(
    broker: StubBroker, clock: ManualClock
) -> None:
    dramatiq.actor(
        lambda: None, actor_name="often", broker=broker, periodic=bd.every("1s", max_late="2s")
    )
    shared = middleware(broker).store
    nodes = [
        bd.Beatless(store=shared, namespace="unit", clock=clock, node=name).scheduler(broker)
        for name in ("a", "b")
    ]
    for _ in range(100):
        clock.advance(100)
        for node in nodes:
            node.tick()
    ids = [dramatiq.Message.decode(raw).message_id for raw in broker.queues["default"].queue]
    assert len(ids) == len(set(ids)) == sum(node.stats["often"].won for node in nodes)
    assert 10 <= len(ids) <= 13  # 10 s of occurrences, and those of the 2 s before start
    assert {node.stats["often"].won for node in nodes} != {0}


def test_a_worker_in_your_own_process_starts_and_stops_the_scheduler_thread(
    broker: StubBroker,
) -> None:
    dramatiq.actor(lambda: None, actor_name="tick", broker=broker, periodic=bd.every("1h"))
    worker = Worker(broker, worker_timeout=50)
    worker.start()
    try:
        scheduler = middleware(broker)._scheduler
        assert scheduler is not None
        assert scheduler._thread is not None
        assert scheduler._thread.is_alive()
    finally:
        worker.stop()
    assert middleware(broker)._scheduler is None
    assert not scheduler._thread.is_alive()


def test_under_the_cli_the_worker_processes_leave_the_scheduler_to_the_fork(
    broker: StubBroker,
) -> None:
    broker.emit_after("process_boot")
    worker = Worker(broker, worker_timeout=50)
    worker.start()
    try:
        assert middleware(broker)._scheduler is None
    finally:
        worker.stop()
    assert middleware(broker).forks == [fork.run_scheduler]


# -- the fork -------------------------------------------------------------------------------


def test_the_fork_loads_the_broker_and_modules_of_the_dramatiq_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bl_fork_app.py").write_text(
        textwrap.dedent(
            """
            import dramatiq
            from dramatiq.brokers.stub import StubBroker
            import beatless.dramatiq as bd

            broker = StubBroker()
            broker.add_middleware(bd.Beatless(store="memory://"))
            """
        )
    )
    (tmp_path / "bl_fork_actors.py").write_text(
        textwrap.dedent(
            """
            import dramatiq
            from bl_fork_app import broker
            import beatless.dramatiq as bd

            @dramatiq.actor(broker=broker, periodic=bd.every("1m"))
            def minute():
                pass
            """
        )
    )
    monkeypatch.setattr(
        sys, "argv", ["dramatiq", "bl_fork_app:broker", "bl_fork_actors", "--path", str(tmp_path)]
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        broker, found = fork.load()
        assert [e.name for e in found.schedule(broker).entries] == ["minute"]
    finally:
        for name in ("bl_fork_app", "bl_fork_actors"):
            sys.modules.pop(name, None)


def test_the_supervisor_restarts_a_dead_scheduler_and_stops_on_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs = tmp_path / "runs"

    def serve(parent: int) -> int:
        with runs.open("a") as out:
            out.write("x")
        return fork.EXIT_CONFIG if len(runs.read_text()) >= 3 else fork.EXIT_FAILED

    monkeypatch.setattr(fork, "serve", serve)
    monkeypatch.setattr(fork, "FIRST_BACKOFF_S", 0.01)
    monkeypatch.setattr(fork, "POLL_S", 0.01)
    with caplog.at_level(logging.INFO, logger="beatless.dramatiq.fork"):
        assert fork.Supervisor().run() == fork.EXIT_CONFIG
    assert runs.read_text() == "xxx"
    died = [r for r in caplog.records if "died (exit code 1)" in r.getMessage()]
    assert len(died) == 2
    assert all(r.levelno == logging.CRITICAL for r in died)
    assert "not restarted" in caplog.records[-1].getMessage()


def test_an_entry_whose_message_cannot_be_encoded_fails_at_start() -> None:
    stub = StubBroker()
    dramatiq.actor(lambda x: None, actor_name="takes", broker=stub)
    entry = Entry(name="bad-args", task="takes", trigger=Every(60), args=[object()])
    stub.add_middleware(bd.Beatless(store="memory://", entries=[entry]))
    with pytest.raises(ConfigError, match="entry 'bad-args': its message cannot be encoded"):
        middleware(stub).schedule(stub)


def test_the_middleware_closes_the_stores_it_opened_and_not_one_given(
    broker: StubBroker, tmp_path: Path
) -> None:
    dramatiq.actor(lambda: None, actor_name="t", broker=broker, periodic=bd.every("1h"))
    given = middleware(broker).store
    opened = bd.Beatless(store=f"sqlite:///{tmp_path / 'claims.db'}")
    first = opened.scheduler(broker).store
    opened.scheduler(broker)
    opened.close()
    request = ClaimRequest("id", "app/t", 0, 60_000, 70_000, 0)
    with pytest.raises(StoreError, match="is closed"):
        first.claim([request], node="n", lease_ms=1_000)  # type: ignore[union-attr]
    middleware(broker).scheduler(broker)
    middleware(broker).close()
    assert given.claim([request], node="n", lease_ms=1_000) == [Outcome.LATE]
