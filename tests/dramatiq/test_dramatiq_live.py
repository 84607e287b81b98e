"""``beatless.dramatiq.live(broker)``: live entries given by actor, on a StubBroker whose
``Beatless`` middleware names the claim store (memory, SQLite, Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from service_check import require_service
from stores import delete_redis_prefix

import beatless.dramatiq as bd
from beatless.core.triggers import Cron, Every
from beatless.dramatiq._live import DramatiqLive
from beatless.errors import ConfigError, ScheduleError
from beatless.live import Live
from beatless.schedule.entry import Entry
from beatless.stores import MemoryStore


@pytest.fixture(params=["memory", "sqlite", "redis"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StubBroker]:
    namespace = f"live{uuid.uuid4().hex[:8]}"
    store: Any = {
        "memory": MemoryStore,
        "sqlite": lambda: f"sqlite:///{tmp_path}/claims.db",
        "redis": lambda: "redis://127.0.0.1:6379/0",
    }[request.param]()
    if request.param == "redis":
        require_service("Redis", "127.0.0.1", 6379)
    stub = StubBroker()
    stub.add_middleware(
        bd.Beatless(store=store, namespace=namespace, timezone="Europe/Paris", jitter="10s")
    )
    dramatiq.actor(lambda: None, actor_name="reports.nightly", broker=stub)
    dramatiq.actor(
        lambda: None, actor_name="cleanup", broker=stub, periodic=bd.every("5m", name="sweep")
    )
    yield stub
    stub.close()
    if request.param == "redis":
        delete_redis_prefix(f"beatless:{namespace}:")


def test_an_entry_is_given_by_actor_name_with_the_middlewares_defaults(broker: StubBroker) -> None:
    with bd.live(broker, writer="alice") as live:
        revision = live.put(
            "report", actor="reports.nightly", trigger=Cron("0 4 * * *"), args=[1], note="new"
        )
        got = Live(live.store, namespace=live.namespace).get("report")

    assert (revision.number, revision.writer, revision.note) == (1, "alice", "new")
    assert got is not None
    assert (got.task, got.args, got.trigger) == ("reports.nightly", (1,), Cron("0 4 * * *"))
    assert got.jitter == timedelta(seconds=10)  # the middleware's default


def test_a_declaration_is_read_as_periodic_reads_it_and_an_actor_object_names_itself(
    broker: StubBroker,
) -> None:
    actor = broker.get_actor("reports.nightly")
    with bd.live(broker) as live:
        live.put(
            "report", actor=actor, trigger=bd.cron("30 2 * * *", jitter="30s", kwargs={"a": 1})
        )
        got = live.get("report")
    assert got is not None
    assert (got.task, got.kwargs, got.jitter) == (
        "reports.nightly",
        {"a": 1},
        timedelta(seconds=30),
    )
    assert got.trigger == Cron("30 2 * * *")


def test_the_store_namespace_and_zone_are_the_middlewares(broker: StubBroker) -> None:
    (middleware,) = [m for m in broker.middleware if isinstance(m, bd.Beatless)]
    with bd.live(broker) as live:
        assert isinstance(live, DramatiqLive)
        assert live.namespace == middleware.namespace
        assert live.timezone == "Europe/Paris"
        if not isinstance(middleware.store, str):
            assert live.store is middleware.store  # given to the middleware: shared, not closed


def test_an_actor_the_broker_does_not_declare_is_refused(broker: StubBroker) -> None:
    with bd.live(broker) as live:
        with pytest.raises(ConfigError, match=r"actor 'reports\.weekly' is not declared.*cleanup"):
            live.put("weekly", actor="reports.weekly", trigger=Every("7d"))
        with pytest.raises(ConfigError, match="not declared"):
            live.put(Entry(name="x", task="nope", trigger=Every("1m")))
        with pytest.raises(ConfigError, match="not declared"):
            live.plan([Entry(name="x", task="nope", trigger=Every("1m"))])
        assert live.head() == 0


def test_a_periodic_actors_entry_name_is_owned_by_the_code(broker: StubBroker) -> None:
    with bd.live(broker) as live:
        with pytest.raises(ScheduleError, match="'sweep' is owned by the code schedule"):
            live.put("sweep", actor="cleanup", trigger=Every("1m"))
        assert live.put("sweep", actor="cleanup", trigger=Every("1m"), override=True).number == 1


def test_a_bad_declaration_is_refused_naming_the_live_entry(broker: StubBroker) -> None:
    with bd.live(broker) as live, pytest.raises(ScheduleError, match="entry 'report': max_late"):
        live.put("report", actor="reports.nightly", trigger=bd.cron("0 4 * * *", jitter="1m"))


def test_options_go_in_the_declaration_or_beside_a_trigger_not_both(broker: StubBroker) -> None:
    with bd.live(broker) as live:
        with pytest.raises(ConfigError, match="inside the declaration"):
            live.put("r", actor="reports.nightly", trigger=bd.every("1m"), args=[1])
        with pytest.raises(ConfigError, match="give actor= and trigger="):
            live.put("r", actor="reports.nightly")
        entries = [Entry(name="r", task="reports.nightly", trigger=Every("1m"))]
        assert live.put_many(entries, note="batch").names == ("r",)


def test_a_broker_without_the_middleware_is_refused() -> None:
    with pytest.raises(ConfigError, match="0 Beatless middleware"):
        bd.live(StubBroker())


def test_a_borrowed_store_keeps_notes_as_the_store_it_wraps() -> None:
    """The store the runs and the fleet commands borrow from the middleware passes kept
    notes through (``beatless schedule --dramatiq`` on a store object given to
    ``Beatless(store=...)``)."""
    from beatless.dramatiq._store import Borrowed
    from beatless.stores.base import KeptNote
    from beatless.stores.memory import MemoryStore

    inner = MemoryStore()
    borrowed = Borrowed(inner)
    assert borrowed.keeps_notes is inner.keeps_notes is True
    borrowed.keep_notes([KeptNote("kind", "key", "value")])
    assert inner.read_kept("kind") == {"key": "value"} == borrowed.read_kept("kind")
    borrowed.delete_kept("kind", ["key"])
    assert borrowed.read_kept("kind") == {}


@pytest.mark.parametrize("live", [True, False])
def test_the_middleware_schedules_live_entries_unless_told_not_to(live: bool) -> None:
    broker = StubBroker()
    beatless = bd.Beatless(store="memory://", live=live)
    broker.add_middleware(beatless)
    dramatiq.actor(lambda: None, actor_name="tick", broker=broker, periodic=bd.every("1h"))
    try:
        assert beatless.scheduler(broker).live.enabled is live
    finally:
        beatless.close()


def test_the_live_option_of_the_middleware_is_a_flag() -> None:
    with pytest.raises(ConfigError, match="live"):
        bd.Beatless(store="memory://", live="yes")  # type: ignore[arg-type]
