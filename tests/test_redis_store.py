"""The Redis claim store against a real Redis: what the contract suite cannot see.

The shared server at 127.0.0.1:6379 is used with a random key prefix per test, and only
the keys under that prefix are deleted afterwards. Cases that flush scripts, need a
password or a unix socket start a private ``redis-server`` of their own.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import logging
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("redis", reason="the redis store needs redis-py")

import redis
from service_check import require_binary, require_service
from stores import PrivateRedis, free_port

from beatless.core.urls import mask_url
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.node.runs import NEVER_LATE_MS
from beatless.schedule.firing import run_lease_id
from beatless.stores import ClaimRequest, Outcome, open_store
from beatless.stores.base import NOTE_VALUE_LIMIT, TOLERANCE_MS, Note, NoteItem
from beatless.stores.redis._wire import (
    CHUNK,
    EXPIRY_SLACK_MS,
    NOTE_VERSION,
    NOTING_LIFE_MS,
    PROBE_TTL_MS,
    claim_arg,
)
from beatless.stores.redis.store import RedisStore, pushed_commands

HOST, PORT = "127.0.0.1", 6379
URL = f"redis://{HOST}:{PORT}/0"
MAX_LATE_MS = 60_000
MEMORY_MS = 80_000
LEASE_MS = 5_000
TAG = "5eed7a95"


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    """A client of the shared Redis, for looking at keys behind the store's back."""
    require_service("Redis", HOST, PORT)
    conn = redis.Redis(host=HOST, port=PORT, db=0, decode_responses=True)
    yield conn
    conn.close()


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    """A key prefix of the test's own; its keys, and only those, are deleted afterwards."""
    value = f"beatless-test:{uuid.uuid4().hex}:"
    yield value
    delete_prefix(client, value)


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1_000))
    if keys:
        client.delete(*keys)


def server_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000 + int(micros) // 1_000


def firing(
    occurrence_ms: int, *, address: str | None = None, release_ms: int | None = None
) -> ClaimRequest:
    id_ = uuid.uuid4().hex
    release = occurrence_ms if release_ms is None else release_ms
    address = address or f"test/{id_[:8]}"
    return ClaimRequest(id_, address, occurrence_ms, MAX_LATE_MS, MEMORY_MS, release, TAG)


def closed_port() -> int:
    return free_port()


class CountingConnection(redis.Connection):
    """A real connection that keeps what it writes: one entry per round trip."""

    sends: ClassVar[list[list[str]]] = []

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        data = command if isinstance(command, bytes) else b"".join(command)
        # The name of each command: the first element of each RESP array.
        self.sends.append([m.decode().upper() for m in COMMAND_NAME.findall(data)])
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


COMMAND_NAME = re.compile(rb"(?:^|\r\n)\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n")


@pytest.fixture
def counting(client: redis.Redis) -> Iterator[redis.Redis]:
    """A client of the shared Redis whose writes are noted in ``CountingConnection.sends``,
    connected already, so that the handshake is not counted."""
    pool = redis.ConnectionPool(host=HOST, port=PORT, connection_class=CountingConnection)
    conn = redis.Redis(connection_pool=pool)
    conn.ping()
    CountingConnection.sends = []
    yield conn
    conn.close()


# -- a private server, for what must not touch the shared one -------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Path]:
    """A ``redis-server`` on a unix socket only, password ``s3cret-pass``; yields the socket."""
    binary = shutil.which("redis-server")
    if binary is None:
        require_binary("redis-server is not installed; this case starts a private server")
    sock = tmp_path / "redis.sock"
    args = [binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
    args += ["--requirepass", "s3cret-pass", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [*args, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"private redis-server did not start (exit code {proc.poll()})")
            time.sleep(0.02)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# -- lateness, on the store's clock -----------------------------------------------------


def test_late_claim_is_refused_by_store_clock(client: redis.Redis, prefix: str) -> None:
    store = RedisStore(URL, prefix=prefix)
    request = firing(server_now_ms(client) - MAX_LATE_MS - TOLERANCE_MS - 2_000)

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.LATE]
    assert set(client.scan_iter(match=f"{prefix}*")) == {f"{prefix}epoch"}
    store.close()


def test_claim_within_max_late_plus_tolerance_of_the_store_clock_is_won(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    request = firing(server_now_ms(client) - MAX_LATE_MS - TOLERANCE_MS + 3_000)

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    store.close()


# -- the record, its expiry and its version ------------------------------------------------


def test_pending_claim_is_a_versioned_record_kept_past_its_lease_for_memory_ms(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    before = server_now_ms(client)
    request = firing(before)
    assert store.claim([request], node="node|1", lease_ms=LEASE_MS) == [Outcome.WON]
    after = server_now_ms(client)

    key = f"{prefix}claim:{request.id}"
    record = client.get(key)
    assert isinstance(record, str)
    version, state, until_ms, memory_ms, tag, node = record.split("|", 5)
    assert (version, state, memory_ms, tag, node) == (
        "v=2",
        "pending",
        str(MEMORY_MS),
        TAG,
        "node|1",
    )
    assert before + LEASE_MS <= int(until_ms) <= after + LEASE_MS
    assert LEASE_MS + MEMORY_MS - 1_000 < client.pttl(key) <= LEASE_MS + MEMORY_MS
    store.close()


def test_commit_keeps_the_claim_for_memory_ms_on_the_store_clock(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    request = firing(server_now_ms(client))
    store.claim([request], node="a", lease_ms=LEASE_MS)

    before = server_now_ms(client)
    assert store.commit([request.id], node="a") == [True]

    key = f"{prefix}claim:{request.id}"
    record = client.get(key)
    assert isinstance(record, str)
    assert record.startswith("v=2|committed|")
    assert record.endswith(f"|{TAG}|a")
    _version, _state, until_ms, _memory, _tag, _node = record.split("|", 5)
    assert before + MEMORY_MS <= int(until_ms) <= server_now_ms(client) + MEMORY_MS
    assert MEMORY_MS < client.pttl(key) <= MEMORY_MS + EXPIRY_SLACK_MS
    store.close()


@pytest.mark.parametrize(
    "value",
    [
        "v=3|pending|1|1|5eed|elsewhere",
        "garbage",
        "v=1|paused|1|1|x",
        "v=1|pending|soon|1|x",
        "v=2|pending|1|1|not-hex|x",
        "v=2|pending|1|1|no-tag-field",
    ],
)
def test_a_record_it_cannot_read_fails_only_its_own_firing_as_corrupt(
    client: redis.Redis, prefix: str, value: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    fresh, unreadable, late = firing(now), firing(now), firing(now - MAX_LATE_MS - 20_000)
    key = f"{prefix}claim:{unreadable.id}"
    client.set(key, value, px=60_000)

    outcomes = store.claim([fresh, unreadable, late], node="a", lease_ms=LEASE_MS)

    assert outcomes == [Outcome.WON, Outcome.CORRUPT, Outcome.LATE]
    assert client.get(key) == value
    assert store.commit([unreadable.id, fresh.id], node="a") == [False, True]
    store.release([unreadable.id], node="a")
    assert client.get(key) == value
    assert 0 < client.pttl(key) <= 60_000
    store.close()


def test_a_key_of_another_type_fails_only_its_own_firing_as_corrupt(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    other, fresh = firing(now), firing(now)
    key = f"{prefix}claim:{other.id}"
    client.hset(key, "owner", "another program")

    assert store.claim([other, fresh], node="a", lease_ms=LEASE_MS) == [
        Outcome.CORRUPT,
        Outcome.WON,
    ]
    assert store.claim_and_push([other], [[["RPUSH", f"{prefix}q", "m"]]], node="a") == [
        Outcome.CORRUPT
    ]
    assert client.hgetall(key) == {"owner": "another program"}
    assert client.exists(f"{prefix}q") == 0
    store.close()


# The claim record parser of the beatless before claim records kept revisions (prelude.lua).
EARLIER_READ = """
local v, state, until_ms, memory, tag, node =
  string.match(redis.call('GET', KEYS[1]), '^v=(%d+)|(%a+)|(%d+)|(%d+)|(%x*)|(.*)$')
return {v, state, node}
"""


def test_a_record_with_a_revision_reads_as_another_nodes_claim_to_an_earlier_beatless(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    live, plain = dataclasses.replace(firing(now), revision=41), firing(now)
    assert store.claim([live, plain], node="a", lease_ms=LEASE_MS) == [Outcome.WON] * 2
    assert store.commit([live.id], node="a") == [True]
    # The earlier parser reads version 2 (not corrupt), its state, and a node name no
    # node of its own has, so it judges the claim another node's: lost, as it is.
    key = f"{prefix}claim:{live.id}"
    assert client.eval(EARLIER_READ, 1, key) == ["2", "committed", "a\x1f41"]
    # A record an earlier beatless wrote (no revision) reads as not recorded.
    assert client.eval(EARLIER_READ, 1, f"{prefix}claim:{plain.id}") == ["2", "pending", "a"]
    records = store.claim_records([live.id, plain.id])
    assert (records[live.id].revision, records[plain.id].revision) == (41, None)
    assert records[live.id].node == records[plain.id].node == "a"
    store.close()


def test_a_version_1_record_written_by_an_earlier_beatless_is_read_as_untagged(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    committed, pending, live = firing(now), firing(now), firing(now)
    client.set(f"{prefix}claim:{committed.id}", f"v=1|committed|{now + 60_000}|80000|old|node")
    client.set(f"{prefix}claim:{pending.id}", f"v=1|pending|{now - 1_000}|80000|old")
    client.set(f"{prefix}claim:{live.id}", f"v=1|pending|{now + 60_000}|80000|5eed|x")

    outcomes = store.claim([committed, pending, live], node="a", lease_ms=LEASE_MS)

    # No tag, never foreign: the last record's node is "5eed|x", not a tag and a node.
    assert outcomes == [Outcome.LOST, Outcome.TAKEOVER, Outcome.HELD]
    taken = client.get(f"{prefix}claim:{pending.id}")
    assert isinstance(taken, str)
    assert taken.startswith("v=2|pending|")
    assert taken.endswith(f"|{TAG}|a")
    assert store.claim([live], node="5eed|x", lease_ms=LEASE_MS) == [Outcome.WON]
    store.close()


def test_a_claim_request_sends_its_tag_and_run_lease_in_the_one_argument_it_already_had() -> None:
    now = 1_800_000_000_000
    tagged, untagged = firing(now), ClaimRequest("u", "x|y", now, 1, 2, now, revision=7)

    assert claim_arg(tagged, 0) == (
        f"{now}|{MAX_LATE_MS}|{MEMORY_MS}|{now}|{TAG}|0|||{tagged.address}"
    )
    assert claim_arg(untagged, 3, "1:8") == f"{now}|1|2|{now}||3|1:8|7|x|y"


def test_release_keeps_the_record_with_its_lease_ended_and_its_memory_as_expiry(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    request = firing(server_now_ms(client))
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    before = server_now_ms(client)
    store.release([request.id], node="a")

    key = f"{prefix}claim:{request.id}"
    record = client.get(key)
    assert isinstance(record, str)
    version, state, until_ms, memory_ms, tag, node = record.split("|", 5)
    assert (version, state, memory_ms, tag, node) == ("v=2", "pending", str(MEMORY_MS), TAG, "a")
    assert before - 1 <= int(until_ms) < server_now_ms(client)
    assert MEMORY_MS - 1_000 < client.pttl(key) <= MEMORY_MS
    assert RedisStore(URL, prefix=prefix).claim([request], node="b", lease_ms=LEASE_MS) == [
        Outcome.TAKEOVER
    ]
    store.close()


def test_early_claim_writes_nothing_under_the_prefix_but_the_epoch(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    early = firing(now, release_ms=now + TOLERANCE_MS + 5_000)

    assert store.claim([early], node="a", lease_ms=LEASE_MS) == [Outcome.EARLY]
    assert set(client.scan_iter(match=f"{prefix}*")) == {f"{prefix}epoch"}
    store.close()


# -- the epoch ---------------------------------------------------------------------------------


def test_the_first_claim_writes_the_epoch_once_and_every_store_object_adopts_it(
    client: redis.Redis, prefix: str
) -> None:
    a, b = RedisStore(URL, prefix=prefix), RedisStore(URL, prefix=prefix)
    before = server_now_ms(client)
    assert a.epoch is None

    a.claim([firing(before)], node="a", lease_ms=LEASE_MS)
    b.claim([firing(before)], node="b", lease_ms=LEASE_MS)

    record = client.get(f"{prefix}epoch")
    assert isinstance(record, str)
    version, started_ms, token, replid, cause = record.split("|")
    assert a.epoch is not None
    assert (version, started_ms, token) == ("v=2", str(a.epoch.started_ms), a.epoch.token)
    assert (replid, cause) == (client.info("replication")["master_replid"], "new")
    assert before <= a.epoch.started_ms <= server_now_ms(client)
    assert b.epoch == a.epoch
    assert client.pttl(f"{prefix}epoch") == -1
    a.close()
    b.close()


def test_an_unreadable_epoch_record_is_a_store_error_that_writes_nothing(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    client.set(f"{prefix}epoch", "garbage")
    request = firing(server_now_ms(client))

    with pytest.raises(StoreError, match="unreadable epoch record") as caught:
        store.claim([request], node="a", lease_ms=LEASE_MS)

    assert not isinstance(caught.value, StoreUnavailable)
    assert client.exists(f"{prefix}claim:{request.id}") == 0
    assert store.epoch is None
    store.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own on a free TCP port, with no persistence."""
    pytest.importorskip("redis")
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def restarted_empty(server: PrivateRedis, store: RedisStore) -> str:
    """Restart ``server`` with no data; returns the run_id it had before."""
    run_id = store.server_run_id()
    server.restart()
    return run_id


def test_a_redis_restarted_empty_gives_forgotten_to_a_store_object_that_saw_it_before(
    own_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="beatless")
    prefix = "beatless-test:"
    a = RedisStore(own_redis.url, prefix=prefix)
    request = firing(a.time_ms())
    assert a.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert a.commit([request.id], node="a") == [True]
    seen = a.epoch

    old_run_id = restarted_empty(own_redis, a)

    assert a.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    assert a.epoch is not None
    assert a.epoch != seen
    new_run_id = a.server_run_id()
    assert new_run_id != old_run_id
    assert "lost its memory" in caplog.text
    assert new_run_id in caplog.text
    # Written committed: no other node may send it either.
    third = RedisStore(own_redis.url, prefix=prefix)
    assert third.claim([request], node="c", lease_ms=LEASE_MS) == [Outcome.LOST]
    with redis.Redis.from_url(own_redis.url, decode_responses=True) as admin:
        record = admin.get(f"{prefix}claim:{request.id}")
        assert isinstance(record, str)
        assert record.startswith("v=2|committed|")
        assert record.endswith(f"|{TAG}|a")
    for store in (a, third):
        store.close()


def test_after_a_restart_only_firings_released_before_the_new_epoch_plus_tolerance_are_forgotten(
    own_redis: PrivateRedis,
) -> None:
    prefix = "beatless-test:"
    a = RedisStore(own_redis.url, prefix=prefix)
    a.claim([firing(a.time_ms())], node="a", lease_ms=LEASE_MS)
    own_redis.restart()
    first = firing(a.time_ms())
    assert a.claim([first], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    assert a.epoch is not None
    horizon = a.epoch.started_ms + TOLERANCE_MS

    before, at = firing(horizon - 1), firing(horizon - 5_000, release_ms=horizon)
    # Released after the new epoch started, but within the tolerance of it.
    recent = firing(a.time_ms())
    assert a.claim([recent], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]

    # A later batch of the same store object: the horizon stays, the epoch is adopted.
    outcomes = a.claim([before, at, recent], node="a", lease_ms=LEASE_MS)
    assert outcomes == [Outcome.FORGOTTEN, Outcome.WON, Outcome.LOST]
    a.close()


def test_a_store_object_opened_after_the_restart_adopts_the_new_epoch_and_wins(
    own_redis: PrivateRedis,
) -> None:
    prefix = "beatless-test:"
    a = RedisStore(own_redis.url, prefix=prefix)
    request = firing(a.time_ms())
    assert a.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert a.commit([request.id], node="a") == [True]
    own_redis.restart()

    fresh = RedisStore(own_redis.url, prefix=prefix)

    assert fresh.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.WON]
    assert fresh.epoch is not None
    # The old store object notices the change all the same, and is held off.
    assert a.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.HELD]
    assert a.epoch == fresh.epoch
    for store in (a, fresh):
        store.close()


def test_claim_and_push_runs_no_command_of_a_forgotten_or_early_firing(
    own_redis: PrivateRedis,
) -> None:
    prefix, queue = "beatless-test:", "beatless-test:queue"
    store = RedisStore(own_redis.url, prefix=prefix)
    now = store.time_ms()
    sent = firing(now)
    assert store.claim_and_push([sent], [[["RPUSH", queue, "sent"]]], node="a") == [Outcome.WON]
    own_redis.restart()

    now = store.time_ms()
    early = firing(now, release_ms=now + TOLERANCE_MS + 5_000)
    pushes = [[["RPUSH", queue, name]] for name in ("again", "early")]
    outcomes = store.claim_and_push([sent, early], pushes, node="a")

    assert outcomes == [Outcome.FORGOTTEN, Outcome.EARLY]
    with redis.Redis.from_url(own_redis.url, decode_responses=True) as admin:
        assert admin.lrange(queue, 0, -1) == []
    store.close()


def test_a_commit_does_not_adopt_a_changed_epoch(own_redis: PrivateRedis) -> None:
    prefix = "beatless-test:"
    a = RedisStore(own_redis.url, prefix=prefix)
    request = firing(a.time_ms())
    assert a.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    seen = a.epoch
    own_redis.restart()
    RedisStore(own_redis.url, prefix=prefix).claim([firing(a.time_ms())], node="b", lease_ms=1)

    assert a.commit([request.id], node="a") == [False]

    assert a.epoch == seen
    assert a.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    a.close()


# -- clock and probe ---------------------------------------------------------------------------


def test_time_ms_is_the_server_clock(client: redis.Redis, prefix: str) -> None:
    store = RedisStore(URL, prefix=prefix)
    before = server_now_ms(client)

    now = store.time_ms()

    assert before <= now <= server_now_ms(client)
    store.close()


def test_probe_writes_reads_and_deletes_a_key_under_the_prefix_only(
    counting: redis.Redis, client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(counting, prefix=prefix)
    written: list[tuple[str, Any]] = []
    set_key = counting.set

    def noting_set(name: str, value: str, **options: Any) -> Any:
        written.append((name, options.get("px")))
        return set_key(name, value, **options)

    monkeypatch.setattr(counting, "set", noting_set)
    store.probe()

    assert CountingConnection.sends == [["SET"], ["GET"], ["DEL"]]
    ((key, px),) = written
    assert key.startswith(f"{prefix}probe:")
    assert px == PROBE_TTL_MS
    assert list(client.scan_iter(match=f"{prefix}*")) == []


def test_probe_of_a_store_at_a_closed_port_raises_store_unavailable() -> None:
    store = RedisStore(f"redis://{HOST}:{closed_port()}/0")

    with pytest.raises(StoreUnavailable, match="cannot probe"):
        store.probe()
    with pytest.raises(StoreUnavailable, match="cannot read the clock"):
        store.time_ms()
    store.close()


def test_probe_with_a_wrong_password_is_a_store_error_naming_the_password_not_showing_it(
    tmp_path: Path,
) -> None:
    server = PrivateRedis(tmp_path, password="right-pass-42")  # noqa: S106 - a test server
    server.start()
    try:
        wrong = RedisStore(f"redis://:wrong-pass-17@{HOST}:{server.port}/0")
        with pytest.raises(StoreError) as caught:
            wrong.probe()
        assert not isinstance(caught.value, StoreUnavailable)
        assert "password" in str(caught.value)
        assert "wrong-pass-17" not in str(caught.value)
        missing = RedisStore(f"redis://{HOST}:{server.port}/0")
        with pytest.raises(StoreError, match="password") as caught:
            missing.probe()
        assert not isinstance(caught.value, StoreUnavailable)
        right = RedisStore(server.url)
        right.probe()
        for store in (wrong, missing, right):
            store.close()
    finally:
        server.stop()


# -- scripts as package files ----------------------------------------------------------------


def test_the_scripts_are_package_files_whose_headers_give_keys_and_argv() -> None:
    folder = importlib.resources.files("beatless.stores.redis") / "lua"

    def read(name: str) -> str:
        return (folder / name).read_text("utf-8")

    store = RedisStore(URL)
    scripts = {
        "claim": (store._claim, ["prelude.lua"]),
        "claim_notes": (store._claim_notes, ["notes.lua"]),
        "commit": (store._commit, ["prelude.lua", "notes.lua"]),
        "release": (store._release, ["prelude.lua"]),
        "post": (store._post, ["notes.lua"]),
    }
    for name, (script, fragments) in scripts.items():
        text = read(f"{name}.lua")
        header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
        assert "KEYS[" in header
        assert "ARGV[1]" in header
        assert script.script == "".join(read(f) for f in fragments) + text
    store.close()


def test_a_claim_writes_its_claim_record_and_nothing_else_per_firing(
    client: redis.Redis, prefix: str
) -> None:
    a, b = RedisStore(URL, prefix=prefix), RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    first, second = firing(now - 1_000, address="app/report"), firing(now, address="app/report")
    other = firing(now, address="app/cleanup")
    a.claim([first], node="a", lease_ms=LEASE_MS)
    a.commit([first.id], node="a")
    b.claim([second, other], node="b", lease_ms=LEASE_MS)
    queue = f"{prefix}queue"
    pushed = firing(now, address="app/pushed")
    assert a.claim_and_push([pushed], [[["RPUSH", queue, "m"]]], node="a") == [Outcome.WON]

    claims = {f"{prefix}claim:{r.id}" for r in (first, second, other, pushed)}
    assert set(client.keys(f"{prefix}*")) == {f"{prefix}epoch", queue, *claims}
    assert a.claim_records([second.id])[second.id].node == "b"
    a.close()
    b.close()


# -- keys and namespaces ---------------------------------------------------------------------


def test_two_namespaces_on_one_redis_never_see_each_other_s_claims(client: redis.Redis) -> None:
    first, second = f"test-{uuid.uuid4().hex}", f"test-{uuid.uuid4().hex}"
    a, b = RedisStore(URL, namespace=first), RedisStore(URL, namespace=second)
    try:
        request = firing(server_now_ms(client))
        assert a.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
        assert b.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.WON]
        assert client.exists(f"beatless:{first}:claim:{request.id}") == 1
        assert client.exists(f"beatless:{second}:claim:{request.id}") == 1
    finally:
        a.close()
        b.close()
        delete_prefix(client, f"beatless:{first}:")
        delete_prefix(client, f"beatless:{second}:")


def test_default_prefix_is_beatless_and_the_namespace() -> None:
    store = RedisStore(URL)
    assert store.prefix == "beatless:default:"
    assert RedisStore(URL, namespace="billing").prefix == "beatless:billing:"
    assert RedisStore(URL, namespace="billing", prefix="mine:").prefix == "mine:"
    store.close()


# -- round trips and scripts ----------------------------------------------------------------


def test_a_batch_of_claims_is_one_evalsha_round_trip(counting: redis.Redis, prefix: str) -> None:
    store = RedisStore(counting, prefix=prefix)
    store.claim([firing(int(time.time() * 1_000))], node="a", lease_ms=LEASE_MS)  # warm up
    store.commit(["warm-up"], node="a")
    store.release(["warm-up"], node="a")
    now = int(time.time() * 1_000)
    batch = [firing(now) for _ in range(1_000)]

    CountingConnection.sends.clear()
    outcomes = store.claim(batch, node="a", lease_ms=LEASE_MS)
    assert CountingConnection.sends == [["EVALSHA"]]
    assert outcomes == [Outcome.WON] * 1_000

    CountingConnection.sends.clear()
    assert store.commit([r.id for r in batch[:500]], node="a") == [True] * 500
    store.release([r.id for r in batch[500:]], node="a")
    assert CountingConnection.sends == [["EVALSHA"], ["EVALSHA"]]
    store.close()


def test_a_batch_larger_than_a_chunk_is_several_scripts_in_one_round_trip(
    counting: redis.Redis, prefix: str
) -> None:
    store = RedisStore(counting, prefix=prefix)
    store.claim([firing(int(time.time() * 1_000))], node="a", lease_ms=LEASE_MS)  # warm up
    now = int(time.time() * 1_000)
    batch = [firing(now) for _ in range(2 * CHUNK + 10)]
    batch[-1] = batch[0]  # the same firing in the first and the last script: won again

    CountingConnection.sends.clear()
    outcomes = store.claim(batch, node="a", lease_ms=LEASE_MS)
    assert CountingConnection.sends == [["EVALSHA"] * 3]
    assert outcomes == [Outcome.WON] * len(batch)

    CountingConnection.sends.clear()
    assert store.commit([r.id for r in batch], node="a") == [True] * len(batch)
    assert CountingConnection.sends == [["EVALSHA"] * 3]
    assert RedisStore(counting, prefix=prefix).claim(batch, node="b", lease_ms=LEASE_MS) == (
        [Outcome.LOST] * len(batch)
    )
    store.close()


def test_script_unknown_to_the_server_is_loaded_again_on_noscript(
    client: redis.Redis, counting: redis.Redis, prefix: str
) -> None:
    store = RedisStore(counting, prefix=prefix)
    # A digest the server has never seen: its answer is NOSCRIPT, as after SCRIPT FLUSH.
    store._claim.sha = "0" * 40

    request = firing(server_now_ms(client))
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    assert CountingConnection.sends == [["EVALSHA"], ["SCRIPT"], ["EVALSHA"]]
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert CountingConnection.sends[3:] == [["EVALSHA"]]


def test_pipelined_scripts_unknown_to_the_server_are_loaded_again(
    client: redis.Redis, counting: redis.Redis, prefix: str
) -> None:
    store = RedisStore(counting, prefix=prefix)
    store._claim.sha = "0" * 40
    batch = [firing(server_now_ms(client)) for _ in range(CHUNK + 1)]

    assert store.claim(batch, node="a", lease_ms=LEASE_MS) == [Outcome.WON] * len(batch)

    first, *then = CountingConnection.sends
    assert first == ["EVALSHA", "EVALSHA"]
    assert ["SCRIPT"] in then
    assert store.commit([r.id for r in batch], node="a") == [True] * len(batch)


def test_the_claim_and_commit_scripts_can_be_loaded_before_their_first_run(
    private_redis: Path,
) -> None:
    url = f"unix://:s3cret-pass@{private_redis}?db=0"
    store = open_store(url, namespace="default", prefix="beatless-test:")
    assert isinstance(store, RedisStore)
    with redis.Redis.from_url(url) as admin:
        admin.script_flush()
        shas = [store._claim.sha, store._notes_script().sha, store._commit.sha]
        assert admin.script_exists(*shas) == [False, False, False]
        store.load_scripts()
        assert admin.script_exists(*shas) == [True, True, True]
    store.close()


def test_scripts_are_loaded_again_after_script_flush(private_redis: Path) -> None:
    url = f"unix://:s3cret-pass@{private_redis}?db=0"
    store = open_store(url, namespace="default", prefix="beatless-test:")
    now = int(time.time() * 1_000)
    first, second = firing(now), firing(now)
    assert store.claim([first], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    with redis.Redis.from_url(url) as admin:
        admin.script_flush()
    assert store.claim([second, first], node="a", lease_ms=LEASE_MS) == [Outcome.WON] * 2
    assert store.commit([first.id], node="a") == [True]
    store.close()


# -- client or URL, and closing only what was opened -----------------------------------------


def test_url_and_client_forms_share_the_same_claims(client: redis.Redis, prefix: str) -> None:
    from_url = open_store(URL, namespace="default", prefix=prefix)
    from_client = RedisStore(client, prefix=prefix)
    text_client = redis.Redis(host=HOST, port=PORT, decode_responses=True)
    decoding = RedisStore(text_client, prefix=prefix)
    request = firing(server_now_ms(client))

    assert from_url.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert from_client.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.HELD]
    assert decoding.commit([request.id], node="b") == [False]
    assert from_url.commit([request.id], node="a") == [True]
    assert decoding.claim([request], node="c", lease_ms=LEASE_MS) == [Outcome.LOST]
    assert decoding.claim_records([request.id])[request.id].node == "a"
    for store in (from_url, from_client, decoding):
        store.close()
    text_client.close()


def test_close_leaves_a_client_passed_in_open(client: redis.Redis, prefix: str) -> None:
    store = RedisStore(client, prefix=prefix)
    store.claim([firing(server_now_ms(client))], node="a", lease_ms=LEASE_MS)

    store.close()

    assert client.ping() is True
    with pytest.raises(StoreError, match="closed"):
        store.claim([firing(server_now_ms(client))], node="a", lease_ms=LEASE_MS)


def test_close_disconnects_the_client_the_store_opened(client: redis.Redis, prefix: str) -> None:
    name = f"beatless-test-{uuid.uuid4().hex[:12]}"
    store = RedisStore(f"{URL}?client_name={name}", prefix=prefix)
    store.claim([firing(server_now_ms(client))], node="a", lease_ms=LEASE_MS)
    assert [c for c in client.client_list() if c["name"] == name]

    store.close()

    deadline = time.monotonic() + 5
    while [c for c in client.client_list() if c["name"] == name]:
        assert time.monotonic() < deadline, "the store's connection is still open"
        time.sleep(0.05)


# -- failures --------------------------------------------------------------------------------


@pytest.mark.serial
def test_store_at_a_closed_port_raises_store_unavailable_quickly() -> None:
    store = RedisStore(f"redis://{HOST}:{closed_port()}/0")
    started = time.monotonic()

    with pytest.raises(StoreUnavailable):
        store.claim([firing(int(time.time() * 1_000))], node="a", lease_ms=LEASE_MS)

    assert time.monotonic() - started < 2.0
    store.close()


def test_password_is_masked_in_repr_logs_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="beatless")
    port = closed_port()
    url = f"redis://app:hunter2-secret@{HOST}:{port}/0?password=hunter2-secret"
    store = RedisStore(url)

    with pytest.raises(StoreUnavailable) as caught:
        store.claim([firing(int(time.time() * 1_000))], node="a", lease_ms=LEASE_MS)

    assert repr(store) == (
        f"RedisStore('redis://app:***@{HOST}:{port}/0?password=***', prefix='beatless:default:')"
    )
    texts = [repr(store), str(caught.value), caplog.text]
    assert caplog.text
    assert all("hunter2" not in text for text in texts)
    passed_in = redis.Redis(host=HOST, port=PORT, password="hunter2-secret")  # noqa: S106
    assert "hunter2" not in repr(RedisStore(passed_in))
    passed_in.close()
    store.close()


def test_wrong_password_is_a_store_error_that_does_not_show_it(private_redis: Path) -> None:
    store = open_store(f"unix://:not-the-pass-123@{private_redis}?db=0", namespace="default")

    with pytest.raises(StoreError) as caught:
        store.claim([firing(int(time.time() * 1_000))], node="a", lease_ms=LEASE_MS)

    assert not isinstance(caught.value, StoreUnavailable)
    assert "not-the-pass-123" not in str(caught.value)
    assert "***" in str(caught.value)
    store.close()


def test_mask_url_hides_the_password_wherever_the_url_carries_it() -> None:
    assert mask_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert mask_url("rediss://user:pw@host/1") == "rediss://user:***@host/1"
    assert mask_url("unix://:pw@/run/redis.sock?db=2") == "unix://:***@/run/redis.sock?db=2"
    assert mask_url("unix:///run/r.sock?password=pw&db=1") == (
        "unix:///run/r.sock?password=***&db=1"
    )
    assert mask_url("redis://host:6379/0") == "redis://host:6379/0"


def test_a_mistyped_store_url_is_refused_without_showing_its_password() -> None:
    with pytest.raises(ConfigError, match="unknown store URL scheme") as caught:
        open_store("redsi://user:hunter2@host:6379/0", namespace="default")
    assert "hunter2" not in str(caught.value)


def test_open_store_routes_redis_rediss_and_unix_urls_without_connecting() -> None:
    stores = [
        open_store(f"redis://127.0.0.1:{closed_port()}/2", namespace="app"),
        open_store("rediss://:pw@redis.example.invalid:6380/0", namespace="default"),
        open_store("unix:///run/redis/redis.sock?db=1", namespace="default"),
    ]

    assert [type(s) for s in stores] == [RedisStore] * 3
    assert [s.name for s in stores] == ["redis"] * 3
    assert repr(stores[1]) == (
        "RedisStore('rediss://:***@redis.example.invalid:6380/0', prefix='beatless:default:')"
    )
    assert isinstance(stores[0], RedisStore)
    assert stores[0].prefix == "beatless:app:"
    assert stores[0].remembers is None
    for store in stores:
        store.close()


def test_missing_driver_raises_config_error_with_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)

    with pytest.raises(ConfigError, match=r"redis extra installs: pip install 'beatless\[redis\]'"):
        RedisStore(URL)


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="namespace"):
        RedisStore(URL, namespace="")
    with pytest.raises(ConfigError, match=r"redis\.Redis client or a redis:// URL"):
        RedisStore(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="scheme"):
        RedisStore("http://example.com/")
    with pytest.raises(ConfigError, match="socket_timeout"):
        RedisStore(URL, socket_timeout=0)


# -- racing -----------------------------------------------------------------------------------


def test_threads_racing_on_the_same_ids_get_exactly_one_won(
    client: redis.Redis, prefix: str
) -> None:
    nodes = 8
    requests = [firing(server_now_ms(client)) for _ in range(300)]
    stores = [RedisStore(URL, prefix=prefix) for _ in range(nodes)]
    barrier = threading.Barrier(nodes)
    results: list[tuple[str, Outcome]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def race(index: int) -> None:
        rng = random.Random(index)
        mine = rng.sample(requests, len(requests))
        try:
            barrier.wait(timeout=10)
            while mine:
                size = rng.randint(1, 40)
                batch, mine = mine[:size], mine[size:]
                outcomes = stores[index].claim(batch, node=f"n{index}", lease_ms=60_000)
                with lock:
                    results.extend((r.id, o) for r, o in zip(batch, outcomes, strict=True))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    won = sorted(id_ for id_, outcome in results if outcome is Outcome.WON)
    assert won == sorted(r.id for r in requests)
    assert {o for _, o in results if o is not Outcome.WON} == {Outcome.HELD}
    assert len(results) == nodes * len(requests)
    for store in stores:
        store.close()


# -- claim and enqueue in one script ----------------------------------------------------------


def test_claim_and_push_runs_the_commands_of_won_firings_only(
    client: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}queue"
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    on_time, late = firing(now), firing(now - MAX_LATE_MS - 11_000)
    pushes = [[["LPUSH", queue, f"message {r.id}"]] for r in (on_time, late)]
    assert store.claim_and_push([on_time, late], pushes, node="a") == [Outcome.WON, Outcome.LATE]
    assert client.lrange(queue, 0, -1) == [f"message {on_time.id}"]
    # The firing is committed at once: another node loses it and pushes nothing.
    again = store.claim_and_push([on_time], pushes[:1], node="b")
    assert again == [Outcome.LOST]
    assert client.llen(queue) == 1
    store.close()


ARGUMENT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", "\n", "12\n", "3\n1\nx", "[", "é\n€", "x" * 2_000]
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payloads=st.lists(st.lists(ARGUMENT, min_size=1, max_size=4), min_size=1, max_size=3),
    form=st.sampled_from(["list", "pushed", "json"]),
)
def test_claim_and_push_runs_each_command_with_its_arguments_byte_for_byte(
    client: redis.Redis, prefix: str, payloads: list[list[str]], form: str
) -> None:
    """Whatever the arguments (newlines, digits, multi-byte characters, empty ones, a
    leading ``[``), each command runs with exactly them, in order, whether the commands
    are given as lists, as :func:`pushed_commands` text or as JSON text."""
    queue = f"{prefix}queue:{uuid.uuid4().hex}"
    commands = [["RPUSH", queue, *values] for values in payloads]
    given_as: Any = {
        "list": commands,
        "pushed": pushed_commands(commands),
        "json": json.dumps(commands),
    }[form]
    store = RedisStore(URL, prefix=prefix)
    request = firing(server_now_ms(client))
    assert store.claim_and_push([request], [given_as], node="a") == [Outcome.WON]
    assert client.lrange(queue, 0, -1) == [v for values in payloads for v in values]
    client.delete(queue)
    store.close()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.lists(
        st.tuples(
            st.lists(st.lists(ARGUMENT, max_size=3), max_size=3),  # each command's values
            st.booleans(),  # held by another node already: lost, nothing run
            st.sampled_from(["none", "note", "logged"]),  # its history note
        ),
        min_size=1,
        max_size=5,
    )
)
def test_each_firing_of_a_batch_runs_exactly_its_own_commands_beside_notes(
    client: redis.Redis, prefix: str, batch: list[tuple[list[list[str]], bool, str]]
) -> None:
    """In one script of several firings, some lost and some noted (their notes' arguments
    come between the requests and the commands' arguments), each firing won runs exactly
    its own commands with their arguments, in order; a firing lost runs none, and the
    firings after it still find their own arguments."""
    queue = f"{prefix}queue:{uuid.uuid4().hex}"
    kind = history_kind()
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    requests = [firing(now) for _ in batch]
    held = [r for r, (_, lost, _) in zip(requests, batch, strict=True) if lost]
    assert store.claim_and_push(held, [[] for _ in held], node="other") == [Outcome.WON] * len(held)
    commands = [
        [["RPUSH", queue, f"{i}.{c}", *values] for c, values in enumerate(pushes)]
        for i, (pushes, _, _) in enumerate(batch)
    ]
    notes = [
        None
        if how == "none"
        else Note(kind, r.id, HISTORY, NOTE_TTL_MS, 10, logged=how == "logged")
        for r, (_, _, how) in zip(requests, batch, strict=True)
    ]
    outcomes = store.claim_and_push(
        requests, commands, node="a", notes=notes if any(notes) else None
    )
    expected = [Outcome.LOST if lost else Outcome.WON for _, lost, _ in batch]
    assert outcomes == expected
    ran = [
        arg
        for command, (_, lost, _) in zip(commands, batch, strict=True)
        if not lost
        for pushed in command
        for arg in pushed[2:]
    ]
    assert client.lrange(queue, 0, -1) == ran
    noted = {
        r.id for r, n, (_, lost, _) in zip(requests, notes, batch, strict=True) if n and not lost
    }
    read = store.read_logs([kind]) if noted else {}
    assert set(read.get(kind, {})) == noted
    client.delete(queue)
    store.close()


def test_pushed_commands_refuses_a_command_without_a_name_or_with_an_argument_not_text() -> None:
    with pytest.raises(ValueError, match="at least its name"):
        pushed_commands([[]])
    with pytest.raises(TypeError, match="arguments are text, got int"):
        pushed_commands([["LPUSH", "q", 3]])  # type: ignore[list-item]


def test_racing_nodes_push_each_firing_exactly_once(client: redis.Redis, prefix: str) -> None:
    queue = f"{prefix}queue"
    now = server_now_ms(client)
    requests = [firing(now) for _ in range(200)]
    pushes = [[["RPUSH", queue, r.id]] for r in requests]
    stores = [RedisStore(URL, prefix=prefix) for _ in range(4)]
    results: dict[int, list[Outcome]] = {}

    def race(index: int) -> None:
        results[index] = stores[index].claim_and_push(requests, pushes, node=f"n{index}")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    queued = client.lrange(queue, 0, -1)
    assert sorted(queued) == sorted(r.id for r in requests)
    won = [o for outcomes in results.values() for o in outcomes if o.is_won]
    assert len(won) == len(requests)
    for store in stores:
        store.close()


def test_claim_and_push_takes_over_a_pending_claim_whose_lease_ran_out(
    client: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}queue"
    store = RedisStore(URL, prefix=prefix)
    request = firing(server_now_ms(client))
    assert store.claim([request], node="two-phase", lease_ms=50) == [Outcome.WON]
    push = [[["LPUSH", queue, "m"]]]
    assert store.claim_and_push([request], push, node="atomic") == [Outcome.HELD]
    time.sleep(0.1)
    assert store.claim_and_push([request], push, node="atomic") == [Outcome.TAKEOVER]
    assert client.llen(queue) == 1
    store.close()


def test_claim_and_push_of_another_task_under_a_claimed_address_is_foreign_and_pushes_nothing(
    client: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}queue"
    ours, theirs = RedisStore(URL, prefix=prefix), RedisStore(URL, prefix=prefix)
    pending, committed = firing(server_now_ms(client)), firing(server_now_ms(client))
    assert theirs.claim([pending], node="two-phase", lease_ms=LEASE_MS) == [Outcome.WON]
    assert theirs.claim_and_push([committed], [[["LPUSH", queue, "theirs"]]], node="x") == [
        Outcome.WON
    ]
    other = [dataclasses.replace(r, tag="0123abcd") for r in (pending, committed)]
    pushes = [[["LPUSH", queue, "ours"]]] * 2

    assert ours.claim_and_push(other, pushes, node="x") == [Outcome.FOREIGN] * 2
    assert client.lrange(queue, 0, -1) == ["theirs"]
    for store in (ours, theirs):
        store.close()


# -- renewal and run leases in the claim script ---------------------------------------------


def skipping(request: ClaimRequest) -> ClaimRequest:
    """The same firing, of an entry whose overlap policy is ``skip``."""
    return dataclasses.replace(request, run_id=run_lease_id(request.address))


def start_run(store: RedisStore, address: str, now: int, lease_ms: int = LEASE_MS) -> str:
    """A worker holds ``address``'s run lease pending, as ``beatless.node.runs`` does; its key."""
    run = ClaimRequest(run_lease_id(address), address, now, NEVER_LATE_MS, 1_000, now)
    assert store.claim([run], node="worker", lease_ms=lease_ms) == [Outcome.WON]
    return run.id


def test_renewal_by_the_holder_writes_its_lease_from_now_in_the_script(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    request = firing(server_now_ms(client))
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    key = f"{prefix}claim:{request.id}"

    before = server_now_ms(client)
    assert store.claim([request], node="a", lease_ms=20_000) == [Outcome.WON]
    after = server_now_ms(client)

    record = client.get(key)
    assert isinstance(record, str)
    _version, state, until_ms, _memory, _tag, node = record.split("|", 5)
    assert (state, node) == ("pending", "a")
    assert before + 20_000 <= int(until_ms) <= after + 20_000
    assert 20_000 + MEMORY_MS - 1_000 < client.pttl(key) <= 20_000 + MEMORY_MS
    store.close()


def test_claim_and_push_of_a_firing_whose_address_runs_is_overlap_and_pushes_nothing(
    client: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}queue"
    store, other = RedisStore(URL, prefix=prefix), RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    address = f"test/{uuid.uuid4().hex[:8]}"
    run_id = start_run(store, address, now, LEASE_MS * 4)
    busy, idle = skipping(firing(now, address=address)), skipping(firing(now))
    pushes = [[["RPUSH", queue, name]] for name in ("busy", "idle")]

    assert store.claim_and_push([busy, idle], pushes, node="a") == [Outcome.OVERLAP, Outcome.WON]

    assert client.lrange(queue, 0, -1) == ["idle"]
    record = client.get(f"{prefix}claim:{busy.id}")
    assert isinstance(record, str)
    assert record.startswith("v=2|committed|")
    assert MEMORY_MS < client.pttl(f"{prefix}claim:{busy.id}") <= MEMORY_MS + EXPIRY_SLACK_MS
    assert other.claim_and_push([busy], pushes[:1], node="b") == [Outcome.LOST]
    assert other.claim([busy], node="b", lease_ms=LEASE_MS) == [Outcome.LOST]
    # The run lease is only read.
    assert str(client.get(f"{prefix}claim:{run_id}")).startswith("v=2|pending|")
    assert str(client.get(f"{prefix}claim:{idle.id}")).startswith("v=2|committed|")
    store.release([run_id], node="worker")
    later = skipping(firing(server_now_ms(client), address=address))
    assert store.claim_and_push([later], [[["RPUSH", queue, "later"]]], node="a") == [Outcome.WON]
    assert client.lrange(queue, 0, -1) == ["idle", "later"]
    for s in (store, other):
        s.close()


def test_run_lease_keys_follow_the_claim_keys_once_each_and_requests_number_them(
    client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    here, there = f"test/{uuid.uuid4().hex[:8]}", f"test/{uuid.uuid4().hex[:8]}"
    batch = [
        skipping(firing(now, address=here)),
        firing(now, address=here),
        skipping(firing(now, address=there)),
        skipping(firing(now + 1, address=here)),
    ]
    sent: list[tuple[list[str], list[str | int]]] = []
    run = store._run

    def spy(
        script: Any, calls: list[tuple[list[str], list[str | int]]], then: Any = ()
    ) -> list[Any]:
        sent.extend(calls)
        return run(script, calls, then)

    monkeypatch.setattr(store, "_run", spy)

    assert store.claim(batch, node="a", lease_ms=LEASE_MS) == [Outcome.WON] * 4

    ((keys, args),) = sent
    claims = [f"{prefix}claim:{r.id}" for r in batch]
    runs = [f"{prefix}claim:{run_lease_id(a)}" for a in (here, there)]
    assert keys == [f"{prefix}epoch", *claims, *runs]
    assert args[11] == 4
    assert [str(a).split("|")[5] for a in args[12:]] == ["1", "0", "2", "1"]
    store.close()


def test_overlap_is_checked_in_every_script_of_a_batch_larger_than_a_chunk(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    address = f"test/{uuid.uuid4().hex[:8]}"
    start_run(store, address, now, LEASE_MS * 4)
    batch = [firing(now) for _ in range(CHUNK + 10)]
    batch[0] = skipping(firing(now, address=address))
    batch[-1] = skipping(firing(now + 1, address=address))

    outcomes = store.claim(batch, node="a", lease_ms=LEASE_MS)

    assert outcomes == [Outcome.OVERLAP] + [Outcome.WON] * (CHUNK + 8) + [Outcome.OVERLAP]
    store.close()


@pytest.mark.parametrize("value", ["garbage", "v=2|committed|1|1|x"])
def test_a_run_lease_record_it_cannot_read_or_not_pending_holds_nothing_and_is_left_alone(
    client: redis.Redis, prefix: str, value: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    now = server_now_ms(client)
    request = skipping(firing(now))
    key = f"{prefix}claim:{request.run_id}"
    client.set(key, value.replace("|1|1|", f"|{now + 60_000}|1|"), px=60_000)
    before = client.get(key)

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert client.get(key) == before
    store.close()


# -- notes written in the claim and commit scripts ------------------------------------------

HISTORY = '{"outcome":"{{outcome}}","at_ms":{{at_ms}},"lateness_ms":{{lateness_ms}}}'
NOTE_TTL_MS = 600_000


def history_kind() -> str:
    return f"history/{uuid.uuid4().hex[:12]}"


def history_note(kind: str, request: ClaimRequest) -> Note:
    return Note(kind, request.id, HISTORY, NOTE_TTL_MS)


def written(client: redis.Redis, store: RedisStore, kind: str) -> dict[str, tuple[int, str]]:
    """The notes of ``kind`` as Redis holds them: ``{key: (expires_ms, value)}``."""
    notes = {}
    for key, record in client.hgetall(store._notes_keys(kind)[0]).items():
        assert isinstance(key, str)
        assert isinstance(record, str)
        version, expires_ms, value = record.split("|", 2)
        assert version == f"v={NOTE_VERSION}"
        notes[key] = (int(expires_ms), value)
    return notes


def outcomes_noted(store: RedisStore, kind: str) -> dict[str, str]:
    return {key: json.loads(v)["outcome"] for key, v in store.read_notes([kind])[kind].items()}


def test_claim_and_push_writes_the_note_of_a_firing_won_with_its_placeholders_replaced(
    client: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}queue"
    store, other = RedisStore(URL, prefix=prefix), RedisStore(URL, prefix=prefix)
    history, unwritten = history_kind(), history_kind()
    now = server_now_ms(client)
    won = firing(now - 3_000, release_ms=now - 2_000)
    late, lost, held, unnoted = (
        firing(now - MAX_LATE_MS - 11_000),
        firing(now),
        firing(now),
        firing(now),
    )
    assert other.claim_and_push([lost], [[]], node="b") == [Outcome.WON]
    assert other.claim([held], node="b", lease_ms=LEASE_MS) == [Outcome.WON]
    batch = [won, late, lost, held, unnoted]
    notes: list[Note | None] = [history_note(history, won)]
    notes += [*(history_note(unwritten, r) for r in (late, lost, held)), None]

    before = server_now_ms(client)
    outcomes = store.claim_and_push(
        batch, [[["RPUSH", queue, r.id]] for r in batch], node="a", notes=notes
    )
    after = server_now_ms(client)

    assert outcomes == [Outcome.WON, Outcome.LATE, Outcome.LOST, Outcome.HELD, Outcome.WON]
    ((expires_ms, value),) = written(client, store, history).values()
    at_ms = json.loads(value)["at_ms"]
    assert before <= at_ms <= after
    lateness_ms = at_ms - won.release_ms
    assert value == f'{{"outcome":"won","at_ms":{at_ms},"lateness_ms":{lateness_ms}}}'
    assert other.read_notes([history]) == {history: {won.id: value}}
    assert expires_ms == at_ms + NOTE_TTL_MS
    # Nothing was written of the kind whose firings were not won, not even its keys.
    assert client.exists(*store._notes_keys(unwritten)) == 0
    for s in (store, other):
        s.close()


def test_claim_and_push_notes_a_takeover_and_nothing_while_the_claim_is_held(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    history = history_kind()
    request = firing(server_now_ms(client))
    assert store.claim([request], node="two-phase", lease_ms=50) == [Outcome.WON]
    push, notes = [[["LPUSH", f"{prefix}queue", "m"]]], [history_note(history, request)]

    assert store.claim_and_push([request], push, node="atomic", notes=notes) == [Outcome.HELD]
    assert store.read_notes([history]) == {history: {}}
    time.sleep(0.1)
    assert store.claim_and_push([request], push, node="atomic", notes=notes) == [Outcome.TAKEOVER]

    assert outcomes_noted(store, history) == {request.id: "takeover"}
    store.close()


def test_claim_and_push_notes_a_firing_skipped_for_overlap_as_skipped(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    history = history_kind()
    now = server_now_ms(client)
    address = f"test/{uuid.uuid4().hex[:8]}"
    start_run(store, address, now, LEASE_MS * 4)
    busy, idle = skipping(firing(now, address=address)), skipping(firing(now))
    notes = [history_note(history, r) for r in (busy, idle)]

    outcomes = store.claim_and_push([busy, idle], [[], []], node="a", notes=notes)

    assert outcomes == [Outcome.OVERLAP, Outcome.WON]
    assert outcomes_noted(store, history) == {busy.id: "skipped_overlap", idle.id: "won"}
    store.close()


BATCH = '{"at_ms":{{at_ms}},"items":[{{items}}]}'


def test_claim_and_push_writes_one_batch_note_with_the_items_of_the_firings_it_notes(
    client: redis.Redis, prefix: str
) -> None:
    store, other = RedisStore(URL, prefix=prefix), RedisStore(URL, prefix=prefix)
    batch_kind, single_kind = history_kind(), history_kind()
    template = Note(batch_kind, "occurrence.node", BATCH, NOTE_TTL_MS)
    now = server_now_ms(client)
    lost, late = firing(now), firing(now - MAX_LATE_MS - 11_000)
    first, second, third = firing(now - 1_000, release_ms=now - 500), firing(now), firing(now)
    alone = firing(now)
    assert other.claim_and_push([lost], [[]], node="b") == [Outcome.WON]
    batch = [lost, first, late, second, alone, third]
    tenants = ["lost", "t-1", "late", 't "2"', "alone", "t-3"]
    notes: list[Note | NoteItem | None] = [NoteItem(template, "[" + json.dumps(t)) for t in tenants]
    notes[4] = history_note(single_kind, alone)

    before = server_now_ms(client)
    outcomes = store.claim_and_push(batch, [[] for _ in batch], node="a", notes=notes)
    after = server_now_ms(client)

    won = Outcome.WON
    assert outcomes == [Outcome.LOST, won, Outcome.LATE, won, won, won]
    # One note for the batch, named after its first firing noted, with the items of the
    # firings won only, in order, each closed with its outcome and lateness.
    ((key, (expires_ms, value)),) = written(client, store, batch_kind).items()
    assert key == f"occurrence.node.{first.id}"
    note = json.loads(value)
    at_ms = note["at_ms"]
    assert before <= at_ms <= after
    assert expires_ms == at_ms + NOTE_TTL_MS
    assert note["items"] == [
        ["t-1", "won", at_ms - first.release_ms],
        ['t "2"', "won", at_ms - second.release_ms],
        ["t-3", "won", at_ms - third.release_ms],
    ]
    assert outcomes_noted(store, single_kind) == {alone.id: "won"}

    # A script that notes none of its batch's firings writes no note of it.
    assert store.claim_and_push(batch[1:2], [[]], node="a", notes=notes[1:2]) == [Outcome.LOST]
    assert len(written(client, store, batch_kind)) == 1
    for s in (store, other):
        s.close()


def test_a_batch_note_is_split_so_that_each_note_stays_within_the_value_limit(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    kind = history_kind()
    template = Note(kind, "o.n", BATCH, NOTE_TTL_MS)
    now = server_now_ms(client)
    requests = [firing(now) for _ in range(1_500)]
    tenants = [f"tenant-{i:05d}-{'x' * 20}" for i in range(len(requests))]
    notes = [NoteItem(template, "[" + json.dumps(t)) for t in tenants]

    outcomes = store.claim_and_push(requests, [[] for _ in requests], node="a", notes=notes)

    assert set(outcomes) == {Outcome.WON}
    values = [value for _, value in written(client, store, kind).values()]
    assert len(values) > 2
    assert all(len(v.encode()) <= NOTE_VALUE_LIMIT for v in values)
    items = [item[0] for v in values for item in json.loads(v)["items"]]
    assert sorted(items) == sorted(tenants)
    store.close()


def test_claim_and_push_notes_a_forgotten_firing_and_not_an_early_one(
    own_redis: PrivateRedis,
) -> None:
    store = RedisStore(own_redis.url, prefix="beatless-test:")
    history = history_kind()
    sent = firing(store.time_ms())
    assert store.claim_and_push([sent], [[]], node="a") == [Outcome.WON]
    own_redis.restart()
    now = store.time_ms()
    early = firing(now, release_ms=now + TOLERANCE_MS + 5_000)
    notes = [history_note(history, r) for r in (sent, early)]

    outcomes = store.claim_and_push([sent, early], [[], []], node="a", notes=notes)

    assert outcomes == [Outcome.FORGOTTEN, Outcome.EARLY]
    assert outcomes_noted(store, history) == {sent.id: "forgotten"}
    store.close()


def test_notes_of_a_claim_larger_than_a_chunk_are_bounded_by_keep_after_the_claims(
    counting: redis.Redis, prefix: str
) -> None:
    store = RedisStore(counting, prefix=prefix)
    store.claim([firing(int(time.time() * 1_000))], node="a", lease_ms=LEASE_MS)  # warm up
    history = history_kind()
    store.post([Note(history, "old", "kept: it expires last", 2 * NOTE_TTL_MS)])
    batch = [firing(int(time.time() * 1_000)) for _ in range(CHUNK + 2)]
    notes = [
        Note(history, r.id, "{{outcome}} {{unknown}} 100%", NOTE_TTL_MS + i, keep=3)
        for i, r in enumerate(batch)
    ]

    store._refresh.supported()  # the server's version, read once per store object
    CountingConnection.sends.clear()
    outcomes = store.claim_and_push(batch, [[]] * len(batch), node="a", notes=notes)

    # Two claim scripts, then, once they answered, the notes script of each.
    assert CountingConnection.sends == [["EVALSHA"] * 2, ["EVALSHA"] * 2]
    assert outcomes == [Outcome.WON] * len(batch)
    # Each notes script bounds the kind after its own notes: those that expire last are
    # left.
    left = {r.id: "won {{unknown}} 100%" for r in batch[-2:]}
    assert store.read_notes([history]) == {history: {"old": "kept: it expires last", **left}}
    store.close()


def test_notes_add_a_key_to_the_claim_script_and_a_script_of_their_own_only_when_given(
    client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(URL, prefix=prefix)
    sent: list[tuple[list[str], list[str | int]]] = []
    then_sent: list[Any] = []
    run = store._run

    def spy(
        script: Any, calls: list[tuple[list[str], list[str | int]]], then: Any = ()
    ) -> list[Any]:
        sent.extend(calls)
        then_sent.extend(then)
        return run(script, calls, then)

    monkeypatch.setattr(store, "_run", spy)
    history = history_kind()
    now = server_now_ms(client)
    plain, noted = [firing(now), firing(now)], [firing(now), firing(now)]
    unnoted = [firing(now)]
    with pytest.raises(ValueError, match="one note"):
        store.claim_and_push(plain, [[], []], node="a", notes=[None])

    store.claim_and_push(plain, [[], []], node="a")
    store.claim_and_push(unnoted, [[]], node="a", notes=[None])
    assert then_sent == []
    store.claim_and_push(noted, [[], []], node="a", notes=[None, history_note(history, noted[1])])

    (plain_keys, plain_args), (unnoted_keys, unnoted_args), (noted_keys, noted_args) = sent
    head = [f"{prefix}epoch"]
    assert plain_keys == head + [f"{prefix}claim:{r.id}" for r in plain]
    # Per request where its commands' arguments start (none here), then no notes.
    first = 12 + 2 * len(plain) + 2
    assert plain_args[12 + len(plain) :] == [f"{first}|"] * len(plain) + [""]
    assert unnoted_keys == [*head, f"{prefix}claim:{unnoted[0].id}"]
    assert unnoted_args[-1] == ""
    # The claim script gets the key it leaves its letters under, and how long they keep.
    claims = [f"{prefix}claim:{r.id}" for r in noted]
    (noting,) = noted_keys[len(head) + len(claims) :]
    assert noted_keys[: len(head) + len(claims)] == head + claims
    assert noting.startswith(f"{prefix}noting:")
    assert noted_args[12 + 2 * len(noted) :] == [NOTING_LIFE_MS]
    # The notes script: that key, then the kind's; the note version, the slack, the
    # requests, one kind kept in place, then per request: none, and kind 1's note with
    # the request's release; no batch.
    ((script, keys, args),) = then_sent
    assert script is store._notes_script()
    assert keys == [noting, *store._notes_keys(history)]
    none = ["", "", ""]
    second = [f"1|{NOTE_TTL_MS}|0|{noted[1].release_ms}", noted[1].id, HISTORY]
    assert args == [NOTE_VERSION, EXPIRY_SLACK_MS, 2, 1, "h", *none, *second, 0]
    # It ran: the letters it read are gone, and the note is written.
    assert client.exists(noting) == 0
    assert outcomes_noted(store, history) == {noted[1].id: "won"}
    store.close()


def test_a_commit_larger_than_a_chunk_sends_its_notes_with_its_first_script_in_one_round_trip(
    counting: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(counting, prefix=prefix)
    store.commit(["warm-up"], node="a")
    history = history_kind()
    batch = [firing(int(time.time() * 1_000)) for _ in range(CHUNK + 1)]
    assert store.claim(batch, node="a", lease_ms=LEASE_MS) == [Outcome.WON] * len(batch)
    sent: list[tuple[list[str], list[str | int]]] = []
    run = store._run

    def spy(
        script: Any, calls: list[tuple[list[str], list[str | int]]], then: Any = ()
    ) -> list[Any]:
        sent.extend(calls)
        return run(script, calls, then)

    monkeypatch.setattr(store, "_run", spy)
    notes = [Note(history, r.id, "sent", NOTE_TTL_MS) for r in batch]

    CountingConnection.sends.clear()
    kept = store.commit([r.id for r in batch], node="a", notes=notes)

    assert CountingConnection.sends == [["EVALSHA", "EVALSHA"]]
    assert kept == [True] * len(batch)
    (first_keys, _), (then_keys, _) = sent
    assert first_keys[-2:] == list(store._notes_keys(history))
    assert then_keys == [f"{prefix}epoch", f"{prefix}claim:{batch[-1].id}"]
    assert store.read_notes([history]) == {history: {r.id: "sent" for r in batch}}
    store.close()
