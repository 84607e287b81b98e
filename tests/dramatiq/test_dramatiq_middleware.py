"""The Dramatiq middleware on a StubBroker: declarations, messages, where it runs."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
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
from beatless.dramatiq import _fork as fork
from beatless.schedule.firing import Firing, firing_id
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


def test_a_declaration_keeps_its_problems_for_the_start_naming_no_entry_yet() -> None:
    declared = bd.cron("61 * * * *", jitter="2 minutes")
    assert declared.trigger is None
    assert len(declared.problems) == 2
    assert declared.problems[0].startswith("cron '61 * * * *'")
    assert "cannot read duration '2 minutes'" in declared.problems[1]
    with pytest.raises(ScheduleError) as caught:
        declared.entry("report")
    assert [e.split(":")[0] for e in caught.value.errors] == ["entry 'report'"] * 2


def test_declaration_problems_are_reported_at_start_with_every_other_problem(
    broker: StubBroker,
) -> None:
    dramatiq.actor(lambda: None, actor_name="typo", broker=broker, periodic=bd.cron("61 * * * *"))
    dramatiq.actor(
        lambda: None, actor_name="wide", broker=broker, periodic=bd.every("10s", jitter="6s")
    )
    dramatiq.actor(
        lambda: None,
        actor_name="late",
        broker=broker,
        periodic=bd.cron("0 2 * * *", jitter="2m", max_late="1m"),
    )
    dramatiq.actor(lambda: None, actor_name="fine", broker=broker, periodic=bd.every("1m"))
    found = middleware(broker).check(broker)
    assert found.schedule is None
    by_entry = {p.split(":")[0]: p for p in found.problems}
    assert set(by_entry) == {"entry 'typo'", "entry 'late'", "entry 'wide'"}
    assert len(found.problems) == 3
    assert "jitter 6s must be under half" in by_entry["entry 'wide'"]
    assert "max_late 1m must be longer than jitter 2m" in by_entry["entry 'late'"]
    with pytest.raises(ScheduleError) as caught:
        middleware(broker).schedule(broker)
    assert caught.value.errors == list(found.problems)


def test_check_lists_unknown_actors_bad_arguments_and_bad_options_at_once() -> None:
    stub = StubBroker()
    stub.add_middleware(
        bd.Beatless(
            store="memory://",
            entries=[
                Entry(name="ghost", task="nobody", trigger=Every(60)),
                Entry(name="bad-args", task="takes", trigger=Every(60), args=[object()]),
                Entry(name="bad-kwargs", task="takes", trigger=Every(60), kwargs={"x": {1, 2}}),
            ],
        )
    )
    dramatiq.actor(lambda x=None: None, actor_name="takes", broker=stub)
    dramatiq.actor(lambda: None, actor_name="odd", broker=stub, periodic="*/5 * * * *")
    dramatiq.actor(
        lambda: None, actor_name="twice", broker=stub, periodic=[bd.every("1m"), bd.every("1h")]
    )
    problems = middleware(stub).check(stub).problems
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "actor 'odd': the periodic option takes cron(...), every(...)" in text
    assert "actor 'twice': 2 periodic declarations share the entry name" in text
    assert "entry 'ghost': task 'nobody' is not an actor of this broker" in text
    assert "entry 'bad-args': args[0] (a object) cannot be encoded as JSONEncoder" in text
    assert "entry 'bad-kwargs': kwargs['x'] (a set) cannot be encoded" in text


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


# -- the namespace ----------------------------------------------------------------------


@pytest.mark.parametrize("store", ["redis://127.0.0.1:6379/12", "sqlite:///claims.db"])
def test_a_shared_store_needs_a_namespace_so_two_apps_never_claim_each_others_firings(
    store: str,
) -> None:
    stub = StubBroker()
    stub.add_middleware(bd.Beatless(store=store))
    dramatiq.actor(lambda: None, actor_name="nightly", broker=stub, periodic=bd.every("1h"))
    (problem,) = middleware(stub).check(stub).problems
    assert problem.startswith("Beatless: namespace is required with the claim store")
    assert 'give namespace="default" to keep their ids' in problem
    named = bd.Beatless(store=store, namespace="billing")
    assert named.address_namespace == "billing"


def test_the_memory_store_serves_one_process_and_needs_no_namespace() -> None:
    assert bd.Beatless(store="memory://").address_namespace == "default"
    assert bd.Beatless(store=MemoryStore()).address_namespace == "default"
    assert bd.Beatless(store="memory://", namespace="unit").address_namespace == "unit"


def test_a_namespace_with_a_slash_or_a_bad_on_schedule_error_is_refused_at_once() -> None:
    with pytest.raises(ConfigError, match="namespace must be a name without '/'"):
        bd.Beatless(store="memory://", namespace="a/b")
    with pytest.raises(ConfigError, match="on_schedule_error must be 'refuse'"):
        bd.Beatless(store="memory://", on_schedule_error="ignore")


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
    with caplog.at_level(logging.INFO, logger="beatless.dramatiq._fork"):
        assert fork.Supervisor().run() == fork.EXIT_CONFIG
    assert runs.read_text() == "xxx"
    died = [r for r in caplog.records if "died (exit code 1)" in r.getMessage()]
    assert len(died) == 2
    assert all(r.levelno == logging.CRITICAL for r in died)
    assert "not restarted" in caplog.records[-1].getMessage()


def test_an_entry_whose_options_cannot_be_encoded_is_named_at_start() -> None:
    stub = StubBroker()
    dramatiq.actor(lambda: None, actor_name="plain", broker=stub)
    entry = Entry(name="bad-options", task="plain", trigger=Every(60), options={"x": object()})
    stub.add_middleware(bd.Beatless(store="memory://", entries=[entry]))
    with pytest.raises(ConfigError, match="entry 'bad-options': its message cannot be encoded"):
        middleware(stub).schedule(stub)


def test_the_middleware_closes_the_stores_it_opened_and_not_one_given(
    broker: StubBroker, tmp_path: Path
) -> None:
    dramatiq.actor(lambda: None, actor_name="t", broker=broker, periodic=bd.every("1h"))
    given = middleware(broker).store
    opened = bd.Beatless(store=f"sqlite:///{tmp_path / 'claims.db'}", namespace="app")
    first = opened.scheduler(broker).store
    opened.scheduler(broker)
    opened.close()
    request = ClaimRequest("id", "app/t", 0, 60_000, 70_000, 0)
    with pytest.raises(StoreError, match="is closed"):
        first.claim([request], node="n", lease_ms=1_000)  # type: ignore[union-attr]
    middleware(broker).scheduler(broker)
    middleware(broker).close()
    assert given.claim([request], node="n", lease_ms=1_000) == [Outcome.LATE]


# -- refuse or consume at start ---------------------------------------------------------


def bad_broker(**options: Any) -> StubBroker:
    stub = StubBroker()
    stub.add_middleware(CurrentMessage())
    stub.add_middleware(bd.Beatless(store="memory://", **options))
    dramatiq.actor(lambda: None, actor_name="typo", broker=stub, periodic=bd.cron("61 * * * *"))
    dramatiq.actor(
        lambda: None, actor_name="wide", broker=stub, periodic=bd.every("10s", jitter="6s")
    )
    return stub


def test_a_worker_with_a_bad_schedule_refuses_to_start_with_every_problem(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = bad_broker()
    worker = Worker(stub, worker_timeout=50)
    with (
        caplog.at_level(logging.CRITICAL, logger="beatless"),
        pytest.raises(bd.ScheduleRefused) as caught,
    ):
        worker.start()
    worker.stop()
    stub.close()
    message = str(caught.value)
    assert message.startswith("beatless: 2 problems in the schedule; this node refuses to start")
    assert "\n  entry 'typo': cron '61 * * * *'" in message
    assert "\n  entry 'wide': jitter 6s must be under half" in message
    assert 'Beatless(..., on_schedule_error="consume")' in message
    assert isinstance(caught.value, ScheduleError)
    assert [f"  {e}" for e in caught.value.errors] == message.splitlines()[1:3]
    assert message in caplog.text
    assert middleware(stub)._scheduler is None


def test_in_consume_mode_the_worker_consumes_schedules_nothing_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = bad_broker(on_schedule_error="consume")
    ran: list[str] = []
    plain = dramatiq.actor(lambda: ran.append("ran"), actor_name="plain", broker=stub)
    worker = Worker(stub, worker_timeout=50)
    with caplog.at_level(logging.INFO, logger="beatless"):
        worker.start()
        try:
            plain.send()
            stub.join("default", timeout=5_000)
            worker.join()
            assert middleware(stub).start(stub) is None
        finally:
            worker.stop()
            stub.close()
    assert ran == ["ran"]
    beat = middleware(stub)
    assert beat._scheduler is None
    assert [p.split(":")[0] for p in beat.schedule_problems] == ["entry 'typo'", "entry 'wide'"]
    (said,) = [r for r in ours(caplog.records) if r.levelno >= logging.WARNING]
    assert said.levelno == logging.ERROR
    assert "This node schedules nothing: it consumes tasks only" in said.getMessage()


def test_in_consume_mode_the_worker_schedules_the_sound_entries_and_names_each_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ghost = Entry(name="ghost", task="nosuch", trigger=Every(60))
    stub = bad_broker(on_schedule_error="consume", entries=[ghost])
    dramatiq.actor(lambda: None, actor_name="tick", broker=stub, periodic=bd.every("1m"))
    worker = Worker(stub, worker_timeout=50)
    with caplog.at_level(logging.INFO, logger="beatless"):
        worker.start()
        try:
            beat = middleware(stub)
            scheduler = beat.start(stub)
            assert scheduler is not None
            assert [e.name for e in scheduler.schedule.entries] == ["tick"]
            record = scheduler.board.node_record(scheduler.now_ms())
        finally:
            worker.stop()
            stub.close()
    assert [p.split(":")[0] for p in beat.schedule_problems] == [
        "entry 'typo'",
        "entry 'ghost'",
        "entry 'wide'",
    ]
    assert record.left_out == "typo,ghost,wide"  # refused when read, then by a timing rule
    warned = [r for r in ours(caplog.records) if r.levelno >= logging.WARNING]
    said = [r.getMessage() for r in warned if r.name.startswith("beatless.dramatiq")]
    assert len(said) == 3
    for name in ("typo", "ghost", "wide"):
        (line,) = [m for m in said if m.startswith(f"beatless: entry {name!r} is left out")]
        assert "; the 1 other entry is scheduled" in line
        assert all(p in line for p in beat.schedule_problems if f"entry {name!r}" in p)
    assert not [r for r in ours(caplog.records) if r.levelno >= logging.ERROR]


def test_in_consume_mode_a_wrong_periodic_value_leaves_out_only_that_actor() -> None:
    stub = bad_broker(on_schedule_error="consume")
    dramatiq.actor(lambda: None, actor_name="tick", broker=stub, periodic=bd.every("1m"))
    dramatiq.actor(lambda: None, actor_name="odd", broker=stub, periodic="every minute")
    found = middleware(stub).check(stub)
    stub.close()
    assert found.usable is not None
    assert [e.name for e in found.usable.entries] == ["tick"]
    assert found.left_out == ("typo", "odd", "wide")
    (odd,) = found.problems_of("odd")
    assert "actor 'odd': the periodic option takes cron(...)" in odd


def test_under_the_cli_the_worker_processes_check_quietly_and_the_fork_reports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = bad_broker(on_schedule_error="consume")
    stub.emit_after("process_boot")
    worker = Worker(stub, worker_timeout=50)
    with caplog.at_level(logging.INFO, logger="beatless"):
        worker.start()
        worker.stop()
        assert not [r for r in ours(caplog.records) if r.levelno >= logging.WARNING]
        assert len(middleware(stub).schedule_problems) == 2
        assert middleware(stub).start(stub) is None  # what the fork's process runs
    stub.close()
    assert len([r for r in ours(caplog.records) if r.levelno == logging.ERROR]) == 1


def test_the_fork_module_does_not_import_the_middleware_module_at_run_time() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(fork))
    checked_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    imported = [
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in checked_only
        for alias in node.names
    ]
    assert "beatless.errors" in imported
    # Dramatiq's own middleware module is fine; beatless's would close a cycle.
    assert not [
        name for name in imported if name.endswith("middleware") and name != "dramatiq.middleware"
    ], imported


def ours(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """beatless's own records: Dramatiq's middleware (its Prometheus exporter on 1.x)
    logs on its own loggers."""
    return [r for r in records if r.name.startswith("beatless")]


def test_the_options_are_checked_once_and_read_as_attributes_of_the_middleware() -> None:
    beat = bd.Beatless(store="memory://", jitter="2m", overlap="skip", once_only=False)
    assert (beat.jitter, beat.overlap, beat.once_only) == (timedelta(minutes=2), "skip", False)
    assert beat.store == beat.settings.store == "memory://"
    assert beat.address_namespace == "default"
    with pytest.raises(AttributeError, match="no attribute 'jiter'"):
        beat.jiter  # noqa: B018 - a name that is no option
    with pytest.raises(ConfigError, match="Beatless: once_only must be true or false"):
        bd.Beatless(store="memory://", once_only="yes")  # type: ignore[arg-type]


def test_catch_up_comes_from_the_middleware_or_the_declaration() -> None:
    stub = StubBroker()
    beat = bd.Beatless(store="memory://", namespace="app", catch_up="none")
    stub.add_middleware(beat)
    dramatiq.actor(lambda: None, actor_name="a", broker=stub, periodic=bd.every("1m"))
    dramatiq.actor(
        lambda: None, actor_name="b", broker=stub, periodic=bd.every("1m", catch_up="all")
    )
    by_name = {e.name: e.catch_up for e in beat.schedule(stub).entries}
    assert by_name == {"a": "none", "b": "all"}
    with pytest.raises(ConfigError, match="catch_up must be one of"):
        bd.Beatless(store="memory://", namespace="app", catch_up="some")


def test_the_preferred_claimer_is_on_by_default_and_can_be_turned_off(
    broker: StubBroker,
) -> None:
    on = bd.Beatless(store="memory://").scheduler(broker)
    off = bd.Beatless(store="memory://", preferred_claimer=False).scheduler(broker)
    try:
        assert on.preference.enabled is True
        assert off.preference.enabled is False
    finally:
        on.dispatcher.close()
        off.dispatcher.close()
    with pytest.raises(ConfigError, match="preferred_claimer must be true or false"):
        bd.Beatless(store="memory://", preferred_claimer="no")  # type: ignore[arg-type]
