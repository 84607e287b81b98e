"""A node's notes posted again without a script (:mod:`beatless.stores.redis._refresh`),
against the shared Redis: which posts take the ``MULTI``, and that what they write reads
as the script's would, expiries on the server's clock, keys never given a shorter life.

Each test has a key prefix of its own; only its keys are deleted afterwards.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("redis", reason="the redis store needs redis-py")

import redis
from service_check import require_service
from stores import REDIS, delete_redis_prefix

from beatless.errors import StoreError
from beatless.stores.base import KeptNote, Note
from beatless.stores.redis._refresh import CLOCK_FRESH_MS, SWEEP_EVERY_MS, Refresh
from beatless.stores.redis._wire import EXPIRY_SLACK_MS
from beatless.stores.redis.store import RedisStore

_, HOST, PORT = REDIS
URL = f"redis://{HOST}:{PORT}/0"
TTL_MS = 15_000


class Clock:
    """The refresh's monotonic clock, moved by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    require_service("Redis", HOST, PORT)
    conn = redis.Redis(host=HOST, port=PORT, db=0, decode_responses=True)
    yield conn
    conn.close()


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    value = f"beatless-test:{uuid.uuid4().hex}:"
    yield value
    delete_redis_prefix(value)


class Counted:
    """A store whose posts are counted by the way they went: scripts and refreshes (in a
    ``MULTI`` of their own, or in a sync's pipeline)."""

    def __init__(self, prefix: str, clock: Callable[[], float], version: str | None = None) -> None:
        self.store = RedisStore(URL, prefix=prefix)
        refresh = self.store._refresh
        if version is not None:
            refresh.server_version = lambda: version
        refresh.clock = clock
        self.scripts = self.refreshes = 0
        run, queue = self.store._run, refresh.queue

        def counted_run(*args: Any) -> Any:
            self.scripts += 1
            return run(*args)

        def counted_queue(*args: Any) -> int:
            self.refreshes += 1
            return queue(*args)

        self.store._run = counted_run  # type: ignore[method-assign]
        refresh.queue = counted_queue  # type: ignore[method-assign]

    def sync(self) -> None:
        """What a node's sync does first: read the notes, dated by the server's clock."""
        self.store.read_synced([], {})

    def read(self, kind: str) -> dict[str, str]:
        return self.store.read_notes([kind])[kind]


def posted(prefix: str, notes: list[Note]) -> tuple[Clock, Counted]:
    """A node's store that read the server's clock and posted ``notes`` (by script: their
    kinds are swept), with its clock."""
    clock = Clock()
    node = Counted(prefix, clock)
    node.sync()
    node.store.post(notes)
    return clock, node


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000 + int(micros) // 1_000


def test_a_kind_swept_lately_is_posted_again_in_a_multi_that_reads_as_the_script_would(
    client: redis.Redis, prefix: str
) -> None:
    clock = Clock()
    node = Counted(prefix, clock)
    node.sync()
    node.store.post(
        [Note("node/n1", "alive", "a1", TTL_MS), Note("node/n1", "progress", "p1", TTL_MS)]
    )
    assert (node.scripts, node.refreshes) == (1, 0)  # first post of the kind: swept
    clock.now += 1
    node.sync()
    before = server_ms(client)
    node.store.post([Note("node/n1", "progress", "p2", TTL_MS)])
    after = server_ms(client)
    assert (node.scripts, node.refreshes) == (1, 1)
    assert node.read("node/n1") == {"alive": "a1", "progress": "p2"}
    notes_key, expiry_key = node.store._notes_keys("node/n1")
    record = client.hget(notes_key, "progress")
    assert record is not None
    _, expires, value = record.split("|", 2)
    assert value == "p2"
    # Dated by the server's clock as read at the sync, moved on: never after the post.
    assert before - 1_000 + TTL_MS <= int(expires) <= after + TTL_MS
    assert client.zscore(expiry_key, "progress") == int(expires)
    for key in (notes_key, expiry_key):
        assert TTL_MS <= client.pttl(key) <= TTL_MS + EXPIRY_SLACK_MS + 1_000


def test_a_refresh_never_shortens_a_kinds_life_and_gives_one_to_keys_made_again(
    client: redis.Redis, prefix: str
) -> None:
    _, node = posted(prefix, [Note("k", "long", "lives an hour", 3_600_000)])
    node.store.post([Note("k", "short", "lives fifteen seconds", TTL_MS)])
    assert node.refreshes == 1
    notes_key, expiry_key = node.store._notes_keys("k")
    for key in (notes_key, expiry_key):
        assert client.pttl(key) > 3_500_000  # not shortened to the second's note
    client.delete(notes_key, expiry_key)  # deleted by hand meanwhile
    node.store.post([Note("k", "again", "made again", TTL_MS)])
    assert node.refreshes == 2
    for key in (notes_key, expiry_key):
        assert 0 < client.pttl(key) <= TTL_MS + EXPIRY_SLACK_MS
    assert node.read("k") == {"again": "made again"}


def test_expired_notes_stay_unread_and_the_next_script_post_sweeps_them(
    client: redis.Redis, prefix: str
) -> None:
    clock, node = posted(prefix, [Note("k", "first", "by script", TTL_MS)])
    notes_key, expiry_key = node.store._notes_keys("k")
    client.hset(notes_key, "stale", "v=1|1|expired long ago")  # as a note left expired
    client.zadd(expiry_key, {"stale": 1})
    node.store.post([Note("k", "kept", "live", TTL_MS)])
    assert node.refreshes == 1
    assert node.read("k") == {"first": "by script", "kept": "live"}
    assert client.hexists(notes_key, "stale")  # a refresh sweeps nothing
    clock.now += SWEEP_EVERY_MS / 1_000
    node.sync()
    node.store.post([Note("k", "kept", "live again", TTL_MS)])
    assert (node.scripts, node.refreshes) == (2, 1)  # swept too long ago: the script
    assert not client.hexists(notes_key, "stale")
    assert client.zscore(expiry_key, "stale") is None
    assert node.read("k") == {"first": "by script", "kept": "live again"}


def test_a_bound_a_log_a_stale_clock_or_an_earlier_redis_takes_the_script(
    client: redis.Redis, prefix: str
) -> None:
    clock, node = posted(
        prefix, [Note("bounded", "a", "1", TTL_MS, keep=5), Note("log", "a", "1", TTL_MS)]
    )
    scripts = node.scripts
    node.store.post([Note("bounded", "b", "2", TTL_MS, keep=5)])  # a keep needs the sweep
    node.store.post([Note("log", "b", "2", TTL_MS, keep=5, logged=True)])
    assert (node.scripts - scripts, node.refreshes) == (2, 0)
    node.store.post([Note("log", "c", "3", TTL_MS)])  # its kind was posted as a log last
    assert node.refreshes == 1
    clock.now += CLOCK_FRESH_MS / 1_000 + 1  # no reading of the server's clock since
    node.store.post([Note("log", "d", "4", TTL_MS)])
    assert node.refreshes == 1
    older = Counted(prefix, Clock(), version="6.2.14")
    older.sync()
    older.store.post([Note("k6", "a", "1", TTL_MS)])
    older.store.post([Note("k6", "a", "2", TTL_MS)])
    assert (older.scripts, older.refreshes) == (2, 0)
    assert older.read("k6") == {"a": "2"}


class RoundTrips:
    """The round trips of every redis-py connection from now on: one packed send each (a
    pipeline sends all its commands at once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        connection = redis.connection.Connection
        send = connection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.count += 1
            send(conn, command, check_health)

        monkeypatch.setattr(connection, "send_packed_command", counted)


def test_a_sync_posts_its_refreshes_and_reads_its_notes_and_the_policy_in_one_round_trip(
    client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    node = Counted(prefix, clock)
    node.store._policy.clock = clock  # how old its reading is, on the same hand-moved clock
    node.sync()
    node.store.post([Note("node/n1", "progress", "p1", TTL_MS)])  # by script: swept
    node.store.keep_notes([KeptNote("live", "head", "r3")])
    node.store.quick_facts()  # a read of its own: it finds which command answers
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    trips = RoundTrips(monkeypatch)

    notes, kept = node.store.post_and_read(
        [Note("node/n1", "progress", "p2", TTL_MS)], ["node/n1", "elsewhere"], {"live": ["head"]}
    )

    assert trips.count == 1
    assert (node.scripts, node.refreshes) == (1, 1)
    assert notes == {"node/n1": {"progress": "p2"}, "elsewhere": {}}
    assert kept == {"live": {"head": "r3"}}
    facts = node.store.quick_facts()  # just after the sync: the policy it read
    assert trips.count == 1
    assert facts is not None
    fact = facts.fact("maxmemory-policy")
    assert fact is not None
    assert fact.value == policy
    clock.now += 1  # a second after the sync
    node.store.quick_facts()
    assert trips.count == 2  # read on its own


def test_a_kind_whose_notes_from_this_store_may_have_expired_takes_the_script(
    client: redis.Redis, prefix: str
) -> None:
    clock, node = posted(prefix, [Note("k", "a", "1", 5_000)])
    clock.now += 3.5  # its note has 1.5 s left: live
    node.sync()
    node.store.post_and_read([Note("k", "a", "2", 5_000)], [], {})
    assert (node.scripts, node.refreshes) == (1, 1)
    clock.now += 4.5  # 0.5 s left, under the margin: the keys may be gone by the write
    node.sync()
    node.store.post_and_read([Note("k", "a", "3", 5_000)], [], {})
    assert (node.scripts, node.refreshes) == (2, 1)
    notes_key, _ = node.store._notes_keys("k")
    assert 0 < client.pttl(notes_key) <= 5_000 + EXPIRY_SLACK_MS
    assert node.read("k") == {"a": "3"}


def test_a_write_refused_in_a_syncs_pipeline_raises_as_a_post_would(
    client: redis.Redis, prefix: str
) -> None:
    _, node = posted(prefix, [Note("k", "a", "1", TTL_MS)])
    notes_key, expiry_key = node.store._notes_keys("k")
    client.delete(expiry_key)
    client.set(expiry_key, "not a sorted set")  # its ZADD fails; the reads do not
    try:
        with pytest.raises(StoreError, match=r"post notes.*WRONGTYPE"):
            node.store.post_and_read([Note("k", "a", "2", TTL_MS)], ["k"], {})
        assert (node.scripts, node.refreshes) == (1, 1)  # refused in the pipeline
    finally:
        client.delete(notes_key, expiry_key)


def test_the_server_version_is_asked_once_and_an_unreadable_one_means_scripts() -> None:
    asked: list[int] = []

    def version(text: str | None) -> Any:
        def read() -> str | None:
            asked.append(1)
            return text

        return read

    assert Refresh(lambda k: (k, k), 1, 0, version("7.2.4")).supported()
    seven = Refresh(lambda k: (k, k), 1, 0, version("7.0.0"))
    assert seven.supported()
    assert seven.supported()  # asked once
    assert not Refresh(lambda k: (k, k), 1, 0, version("6.2.14")).supported()
    assert not Refresh(lambda k: (k, k), 1, 0, version(None)).supported()
    assert not Refresh(lambda k: (k, k), 1, 0, version("unknown")).supported()
    assert len(asked) == 5


POSTS = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(["k1", "k2", "k3"]),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 999),
            st.sampled_from([1, 10_000, TTL_MS, 60_000]),
            st.sampled_from([0, 0, 0, 2]),
        ),
        min_size=1,
        max_size=4,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25, deadline=None)
@given(posts=POSTS)
def test_any_posts_read_the_same_through_refreshes_as_through_scripts_alone(
    posts: list[list[tuple[str, str, int, int, int]]],
) -> None:
    require_service("Redis", HOST, PORT)
    base = f"beatless-test:{uuid.uuid4().hex}:"
    try:
        mixed = Counted(base + "mixed:", time.monotonic)
        scripted = Counted(base + "scripted:", time.monotonic, version="6.0.0")
        for store in (mixed, scripted):
            store.sync()
            for k, post in enumerate(posts):
                notes = [
                    Note(kind, key, f"{key}{value}", ttl, keep)
                    for kind, key, value, ttl, keep in post
                ]
                if k % 2:  # as a node's sync posts them: in the pipeline of its read
                    store.store.post_and_read(notes, ["k1"], {})
                else:
                    store.store.post(notes)
        for kind in ("k1", "k2", "k3"):
            notes = [note for post in posts for note in post if note[0] == kind]
            short = {key for _, key, _, ttl, _ in notes if ttl < 2_000}
            last = {key: f"{key}{value}" for _, key, value, _, _ in notes}
            want = scripted.read(kind)
            got = mixed.read(kind)
            assert all(last[key] == value for key, value in got.items())
            if any(keep for *_, keep in notes):
                # Which notes a bound drops goes by their expiries, and notes written a
                # millisecond apart may tie on one path and not on the other: the bound
                # keeps as many on both, each with its last value. A note written after
                # the kind's last bounded post is on both, whichever the bound dropped:
                # then the counts may differ by the notes it brings back.
                bounded = [
                    i for i, post in enumerate(posts) if any(n[0] == kind and n[4] for n in post)
                ]
                keep = next(n[4] for n in reversed(posts[bounded[-1]]) if n[0] == kind and n[4])
                later = [n for post in posts[bounded[-1] + 1 :] for n in post if n[0] == kind]
                last_ttl = {key: ttl for _, key, _, ttl, _ in later}
                lasting = {key for key, ttl in last_ttl.items() if ttl >= 2_000}
                for held in (got, want):
                    assert lasting <= held.keys()
                    assert len(held) <= keep + len(last_ttl)
                if not short and not later:
                    assert len(got) == len(want)
                continue
            # A note of 1 ms may be live in one and expired in the other: the rest agree.
            assert {k: v for k, v in got.items() if k not in short} == {
                k: v for k, v in want.items() if k not in short
            }
        assert scripted.refreshes == 0
    finally:
        delete_redis_prefix(base)
