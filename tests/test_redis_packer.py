"""The Redis store's own packer (:mod:`beatless.stores.redis._packer`): the bytes redis-py
would send, in one piece, and what a store made from a URL uses."""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

redis = pytest.importorskip("redis")
from redis.connection import Encoder, PythonRespSerializer  # noqa: E402
from service_check import require_service  # noqa: E402

from beatless.stores.base import ClaimRequest, Outcome  # noqa: E402
from beatless.stores.redis._client import client_from_url  # noqa: E402
from beatless.stores.redis._packer import Packer  # noqa: E402
from beatless.stores.redis._wire import CHUNK  # noqa: E402
from beatless.stores.redis.store import RedisStore  # noqa: E402

ENCODER = Encoder("utf-8", "strict", False)
ARGUMENT = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.binary(min_size=6_000, max_size=7_000),  # past redis-py's piece size
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(
    name=st.sampled_from(["EVALSHA", "CONFIG GET", b"SET", b"CLIENT SETNAME"]),
    args=st.lists(ARGUMENT, max_size=300),
)
def test_the_packer_writes_the_bytes_redis_py_writes_in_one_piece(
    name: str | bytes, args: list[object]
) -> None:
    ours = Packer(ENCODER.encode).pack(name, *args)
    theirs = PythonRespSerializer(6_000, ENCODER.encode).pack(name, *args)
    assert len(ours) == 1
    assert ours[0] == b"".join(bytes(piece) for piece in theirs)


def test_a_store_client_made_from_a_url_packs_with_it_and_talks_to_redis() -> None:
    require_service("Redis", "127.0.0.1", 6379)
    client = client_from_url(redis, "redis://127.0.0.1:6379/0", 5.0, "the test's URL")
    key = f"beatless-test:{uuid.uuid4().hex}:packed"
    try:
        packer = client.connection_pool.connection_kwargs.get("command_packer")
        if redis.utils.HIREDIS_AVAILABLE:
            assert packer is None  # redis-py's C packer is kept
        else:
            assert isinstance(packer, Packer)
        values = [f"v{i}" for i in range(500)]
        assert client.rpush(key, *values) == 500
        assert client.eval("return #ARGV", 0, *values) == 500
        assert [v.decode() for v in client.lrange(key, 0, -1)] == values
    finally:
        client.delete(key)
        client.close()


@given(commands=st.integers(min_value=1, max_value=5), packed=st.integers(0, 8))
def test_a_hold_is_called_once_its_commands_are_packed_and_only_on_its_own_thread(
    commands: int, packed: int
) -> None:
    packer = Packer(ENCODER.encode)
    calls: list[int] = []
    made = [0]
    with packer.holding(commands, lambda: calls.append(made[0])):
        for _ in range(packed):
            made[0] += 1
            packer.pack("PING")
            # Another thread packs beside it: its commands do not count.
            other = threading.Thread(target=packer.pack, args=("PING",))
            other.start()
            other.join()
    assert calls == ([commands] if packed >= commands else [])
    held = list(calls)
    for _ in range(commands):
        packer.pack("PING")  # the hold ended with its block: nothing fires now
    assert calls == held


@pytest.mark.parametrize("made_from", ["url", "client"])
@pytest.mark.parametrize("size", [1, 3, CHUNK + 1])
def test_a_claim_is_held_before_its_send_and_sent_once_the_hold_returns(
    made_from: str, size: int
) -> None:
    """``before_send`` runs once per claim call, before anything of it reaches Redis (a
    batch larger than a chunk is several scripts in one round trip: one hold), with a
    store made from a URL (its packer holds the packed bytes) or from a client."""
    require_service("Redis", "127.0.0.1", 6379)
    url = "redis://127.0.0.1:6379/0"
    prefix = f"beatless-test:{uuid.uuid4().hex}:"
    queue = f"{prefix}queue"
    looker = redis.Redis.from_url(url)
    store = RedisStore(url if made_from == "url" else redis.Redis.from_url(url), prefix=prefix)
    seconds, micros = looker.time()
    now = int(seconds) * 1_000 + int(micros) // 1_000
    requests = [
        ClaimRequest(uuid.uuid4().hex, f"test/{i}", now, 60_000, 80_000, now) for i in range(size)
    ]
    pushes = [[["RPUSH", queue, r.id]] for r in requests]
    seen: list[int] = []
    try:
        outcomes = store.claim_and_push(
            requests, pushes, node="a", before_send=lambda: seen.append(looker.llen(queue))
        )
        assert outcomes == [Outcome.WON] * size
        assert seen == [0]
        assert looker.llen(queue) == size
    finally:
        keys = list(looker.scan_iter(match=f"{prefix}*", count=1_000))
        if keys:
            looker.delete(*keys)
        store.close()
        looker.close()
