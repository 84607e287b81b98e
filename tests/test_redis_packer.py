"""The Redis store's own packer (:mod:`beatless.stores.redis._packer`): the bytes redis-py
would send, in one piece, and what a store made from a URL uses."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

redis = pytest.importorskip("redis")
from redis.connection import Encoder, PythonRespSerializer  # noqa: E402
from service_check import require_service  # noqa: E402

from beatless.stores.redis._client import client_from_url  # noqa: E402
from beatless.stores.redis._packer import Packer  # noqa: E402

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
