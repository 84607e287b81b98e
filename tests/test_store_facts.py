"""What the claim store can remember: its settings, read and judged at start and at every
sync, and a store that cannot keep claims refused. Against a private ``redis-server`` on a
free port (``tests/faults/redis_server.py``), never the shared one."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis store needs redis-py")
import redis

sys.path.insert(0, str(Path(__file__).parent / "faults"))
from redis_server import RedisServer, admin_client, private_redis
from stores import StoreFactory

from beatless import Entry, Every, Schedule
from beatless.cli.command import main
from beatless.errors import StoreRefused
from beatless.node.scheduler import Decision, Scheduler
from beatless.schedule.firing import Firing
from beatless.stores.base import UNKNOWN, ClaimRequest, Outcome, Verdict
from beatless.stores.redis.store import RedisStore

FIX = "CONFIG SET maxmemory-policy noeviction"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from private_redis(tmp_path)


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    yield from admin_client(server)


def schedule() -> Schedule:
    return Schedule([Entry(name="beat", task="tasks.t", trigger=Every(1), max_late="3s")])


def store_of(server: RedisServer, url: str | None = None) -> RedisStore:
    return RedisStore(url or server.url, namespace=f"facts-{uuid.uuid4().hex[:8]}")


def test_facts_of_a_redis_without_persistence_say_noeviction_ok_and_warn_of_restarts(
    server: RedisServer,
) -> None:
    with store_of(server) as store:
        facts = store.facts()

    values = {f.name: (f.value, f.verdict) for f in facts.facts}
    assert values["maxmemory-policy"] == ("noeviction", Verdict.OK)
    assert values["maxmemory"] == ("0 (no limit)", Verdict.OK)
    assert values["appendonly"] == ("no", Verdict.WARN)
    assert values["save"] == ("''", Verdict.OK)
    assert values["role"] == ("master", Verdict.OK)
    assert values["connected replicas"] == ("0", Verdict.OK)
    assert facts.verdict is Verdict.WARN
    assert facts.summary() == "warn: appendonly no"
    assert "a restart forgets every claim" in (facts.fact("appendonly") or "").why  # type: ignore[union-attr]
    assert facts.refusal() is None


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_policy_is_refused_at_start_with_one_line(
    server: RedisServer, admin: redis.Redis, policy: str
) -> None:
    admin.config_set("maxmemory", "100mb")
    admin.config_set("maxmemory-policy", policy)

    with store_of(server) as store, pytest.raises(StoreRefused) as raised:
        Scheduler(schedule(), store=store, node="n1")

    message = str(raised.value)
    assert "\n" not in message
    assert f"maxmemory-policy {policy}:" in message
    assert FIX in message
    assert server.url.rsplit("/", 1)[0] in message


def test_an_evicting_policy_without_maxmemory_is_a_warning_not_a_refusal(
    server: RedisServer, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # maxmemory 0: Redis evicts nothing, and a limit set later is seen within a sync.
    admin.config_set("maxmemory-policy", "allkeys-lru")

    with store_of(server) as store, caplog.at_level(logging.INFO):
        Scheduler(schedule(), store=store, node="n1")

    fact = store.facts().fact("maxmemory-policy")
    assert fact is not None
    assert fact.verdict is Verdict.WARN
    assert any("maxmemory-policy allkeys-lru" in r.getMessage() for r in caplog.records)


def test_a_renamed_config_falls_back_to_info_and_says_unknown_where_nothing_answers(
    server: RedisServer, admin: redis.Redis
) -> None:
    # A managed Redis: CONFIG refused to the user the nodes log in as, then INFO too.
    admin.execute_command(
        "ACL", "SETUSER", "noconfig", "on", "nopass", "~*", "&*", "+@all", "-config"
    )
    admin.execute_command(
        "ACL", "SETUSER", "blind", "on", "nopass", "~*", "&*", "+@all", "-config", "-info"
    )
    admin.config_set("maxmemory", "100mb")
    admin.config_set("maxmemory-policy", "allkeys-lru")
    url = f"redis://noconfig@127.0.0.1:{server.port}/0"

    with store_of(server, url) as store:
        facts = store.facts()
        with pytest.raises(StoreRefused, match="maxmemory-policy allkeys-lru"):
            Scheduler(schedule(), store=store, node="n1")
    values = {f.name: f.value for f in facts.facts}
    assert values["maxmemory-policy"] == "allkeys-lru"  # from INFO memory
    assert values["appendonly"] == "no"  # aof_enabled, from INFO persistence
    assert values["save"] == UNKNOWN  # only CONFIG knows it

    with store_of(server, f"redis://blind@127.0.0.1:{server.port}/0") as store:
        blind = store.facts()
        Scheduler(schedule(), store=store, node="n1")  # starts: nothing refused, all unknown
    assert {f.value for f in blind.facts} == {UNKNOWN}
    assert blind.verdict is Verdict.WARN
    assert blind.refusal() is None


@pytest.mark.slow
def test_a_policy_changed_under_a_running_scheduler_stops_claims_within_one_sync(
    server: RedisServer, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    admin.config_set("maxmemory", "100mb")
    sent: list[tuple[float, Firing]] = []
    decided: list[Decision] = []
    with store_of(server) as store:
        scheduler = Scheduler(
            schedule(),
            store=store,
            node="n1",
            enqueue=lambda f: sent.append((time.time(), f)),
            on_decision=decided.append,
            lease="2s",
        )
        with caplog.at_level(logging.WARNING):
            scheduler.start()
            try:
                time.sleep(2.2)
                changed = time.time()
                admin.config_set("maxmemory-policy", "allkeys-lru")
                time.sleep(3.0)
                record_seen = scheduler.board.node_record(scheduler.now_ms()).store_verdict
            finally:
                scheduler.stop(timeout=5)
                admin.config_set("maxmemory-policy", "noeviction")

    before = [f for at, f in sent if at < changed]
    after = [f for at, f in sent if at >= changed + 1.2]  # a sync (1 s) and a wake
    assert before, "the scheduler sent nothing before the change"
    assert after == []
    refused = [d for d in decided if d.outcome == "store_refused"]
    assert refused, [d.outcome for d in decided]
    assert record_seen == "refuse: maxmemory-policy allkeys-lru"
    stopped = [
        r.getMessage()
        for r in caplog.records
        if r.name == "beatless.fleet" and "claims stopped" in r.getMessage()
    ]
    assert len(stopped) == 1, stopped
    assert FIX in stopped[0]


def test_check_store_prints_the_settings_as_a_table_with_the_verdict(
    server: RedisServer, admin: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "schedule.toml"
    target.write_text('[[entry]]\nname = "beat"\ntask = "tasks.t"\nevery = "10s"\n')

    assert main(["check", str(target), "--store", server.url]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("redis store redis://"))
    assert out[head].endswith(": warn, used_memory " + out[head].split("used_memory ")[1])
    assert out[head + 1].split() == ["setting", "value", "verdict", "why"]
    rows = {line.split()[0]: line.split() for line in out[head + 2 : head + 8]}
    assert rows["maxmemory-policy"][1:3] == ["noeviction", "ok"]
    assert rows["appendonly"][1:3] == ["no", "warn"]

    admin.config_set("maxmemory", "100mb")
    admin.config_set("maxmemory-policy", "volatile-lru")
    assert main(["check", str(target), "--store", server.url]) == 1
    captured = capsys.readouterr()
    assert "redis store redis://" in captured.out
    assert ": refuse" in captured.out
    assert "maxmemory-policy volatile-lru:" in captured.err
    assert FIX in captured.err


def test_claims_resume_once_the_policy_is_fixed(server: RedisServer, admin: redis.Redis) -> None:
    admin.config_set("maxmemory", "100mb")
    with store_of(server) as store:
        now = store.time_ms()
        request = ClaimRequest(
            id=uuid.uuid4().hex,
            address="a",
            occurrence_ms=now,
            max_late_ms=60_000,
            memory_ms=60_000,
            release_ms=now,
        )
        admin.config_set("maxmemory-policy", "allkeys-random")
        store.watch()
        with pytest.raises(StoreRefused, match="claims stopped: redis store"):
            store.claim([request], node="n1", lease_ms=5_000)
        admin.config_set("maxmemory-policy", "noeviction")
        store.watch()
        assert store.claim([request], node="n1", lease_ms=5_000)[0].is_won


def test_a_claim_evicted_before_the_claims_stopped_is_forgotten_once_they_resume(
    server: RedisServer, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault: a won claim evicted (deleted here, as Redis evicts it: a key with a TTL)
    while an evicting policy is set under two running store objects, one of which claimed
    nothing yet. The epoch is begun again (cause ``evicted``); once the policy is fixed,
    the firing is forgotten (written committed, not sent), not won again: by the other
    store object, or by one made after the fix, which never saw the old epoch."""
    admin.config_set("maxmemory", "100mb")
    namespace = f"facts-{uuid.uuid4().hex[:8]}"
    request = ClaimRequest(
        id=uuid.uuid4().hex,
        address=f"{namespace}/beat",
        occurrence_ms=int(admin.time()[0]) * 1_000,
        max_late_ms=60_000,
        memory_ms=60_000,
        release_ms=int(admin.time()[0]) * 1_000,
    )
    with (
        RedisStore(server.url, namespace=namespace) as first,
        RedisStore(server.url, namespace=namespace) as second,
    ):
        first.watch()
        second.watch()
        assert first.claim([request], node="n1", lease_ms=30_000)[0].is_won
        epoch_key = first.prefix + "epoch"
        before = admin.get(epoch_key)
        admin.config_set("maxmemory-policy", "volatile-ttl")
        assert admin.delete(f"{first.prefix}claim:{request.id}") == 1, "the claim's key"
        with caplog.at_level(logging.WARNING, logger="beatless.stores.redis.store"):
            for _ in range(2):
                first.watch(quick=True)
                second.watch(quick=True)
        assert first.refusal is not None
        assert second.refusal is not None
        after = admin.get(epoch_key)
        assert after is not None
        assert after != before
        assert after.endswith(b"|evicted"), after
        begun = [r for r in caplog.records if "its epoch is begun again" in r.getMessage()]
        assert len(begun) == 2, "said once by each store object"
        admin.config_set("maxmemory-policy", "noeviction")
        second.watch(quick=True)
        assert second.refusal is None
        assert second.claim([request], node="n2", lease_ms=30_000) == [Outcome.FORGOTTEN]
    admin.delete(f"{first.prefix}claim:{request.id}")
    with RedisStore(server.url, namespace=namespace) as later:
        later.watch()
        assert later.claim([request], node="n3", lease_ms=30_000) == [Outcome.FORGOTTEN]


def test_every_store_reads_its_facts_and_none_of_the_test_servers_is_refused(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    store.probe()  # a bucket or a schema exists from here on

    facts = store.watch()

    assert facts.store.startswith(f"{store.name.replace('-', ' ')} store")
    assert facts.refusal() is None
    assert store.refusal is None
    assert all(f.value != UNKNOWN for f in facts.facts), facts
    assert all(f.why for f in facts.facts if f.verdict is not Verdict.OK)
    expected = {
        "memory": set(),
        "sqlite": set(),
        "redis": {"maxmemory-policy", "appendonly", "role"},
        "redis-cluster": {"maxmemory-policy", "appendonly", "role"},
        "postgres": {"synchronous_commit", "fsync", "standby", "replicas"},
        "nats": {"storage", "replicas"},
        "rabbitmq": {"slot queues", "durable"},
    }[store.name]
    assert expected <= {f.name.split(" @")[0] for f in facts.facts}


@pytest.mark.parametrize(
    ("row", "verdict", "named"),
    [
        (("on", "on", False, "", 0), Verdict.OK, None),
        (("off", "on", False, "", 0), Verdict.WARN, "synchronous_commit"),
        (("on", "on", False, "", 2), Verdict.WARN, "replicas"),
        (("on", "on", False, "ANY 1 (s1, s2)", 2), Verdict.OK, None),
        (("on", "off", False, "", 0), Verdict.WARN, "fsync"),
        (("on", "on", True, "", 0), Verdict.REFUSE, "standby"),
    ],
)
def test_postgres_settings_are_judged_on_what_a_crash_or_a_failover_would_cost(
    row: tuple[object, ...], verdict: Verdict, named: str | None
) -> None:
    pytest.importorskip("psycopg")
    from beatless.stores.postgres.store import settings_facts

    facts = settings_facts("postgres store postgresql://db/test", row)

    assert facts.verdict is verdict
    if named is not None:
        assert [f.name for f in facts.facts if f.verdict is verdict] == [named]
    if verdict is Verdict.REFUSE:
        assert facts.refusal() == (
            "postgres store postgresql://db/test: standby yes: a standby (in recovery) is "
            "read-only: point the URL at the primary"
        )
