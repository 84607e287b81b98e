"""The history notes of an atomic claim, written by a script of their own sent once the
claim script has answered (``claim_notes.lua``): what the claim leaves it, what it writes
when the claim failed part-way, when Redis went over its ``maxmemory`` in between, and
what is said when it could not write."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

pytest.importorskip("redis")

import redis
import test_redis_store
import test_store_redis_logs
from stores import PrivateRedis
from test_redis_store import (
    URL,
    firing,
    history_kind,
    history_note,
    outcomes_noted,
    server_now_ms,
)

from beatless.errors import StoreError
from beatless.stores import Outcome
from beatless.stores.redis.store import RedisStore

client = test_redis_store.client
"""A client of the shared Redis (the Redis store tests' fixture)."""
prefix = test_redis_store.prefix
"""A key prefix of the test's own (the Redis store tests' fixture)."""
own_redis = test_store_redis_logs.own_redis
"""A private ``redis-server`` (the logged notes tests' fixture)."""


def noting_keys(client: redis.Redis, prefix: str) -> list[Any]:
    return list(client.scan_iter(match=f"{prefix}noting:*"))


def test_the_notes_are_written_as_of_the_claims_time_and_leave_no_key_behind(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    history = history_kind()
    now = server_now_ms(client)
    won = firing(now - 2_000, release_ms=now - 1_500)
    late = firing(now - 200_000)
    queue = f"{prefix}queue"

    outcomes = store.claim_and_push(
        [won, late],
        [[["RPUSH", queue, "won"]], [["RPUSH", queue, "late"]]],
        node="a",
        notes=[history_note(history, won), history_note(history, late)],
    )

    assert outcomes == [Outcome.WON, Outcome.LATE]
    assert client.lrange(queue, 0, -1) == ["won"]
    (value,) = store.read_notes([history])[history].values()
    note = json.loads(value)
    assert note["outcome"] == "won"
    # The claim script's TIME, carried to the notes script: the lateness is from it.
    assert note["lateness_ms"] == note["at_ms"] - won.release_ms
    assert now <= note["at_ms"] <= server_now_ms(client)
    assert noting_keys(client, prefix) == []
    store.close()


def test_a_claim_that_fails_part_way_still_notes_the_firings_it_sent_before(
    client: redis.Redis, prefix: str
) -> None:
    store = RedisStore(URL, prefix=prefix)
    history = history_kind()
    now = server_now_ms(client)
    sent, refused = firing(now), firing(now)
    queue, not_a_list = f"{prefix}queue", f"{prefix}not-a-list"
    client.set(not_a_list, "a string: RPUSH on it fails")

    with pytest.raises(StoreError, match="WRONGTYPE"):
        store.claim_and_push(
            [sent, refused],
            [[["RPUSH", queue, "sent"]], [["RPUSH", not_a_list, "refused"]]],
            node="a",
            notes=[history_note(history, sent), history_note(history, refused)],
        )

    # The first firing is in its queue, so it is in its history; the second is in neither
    # (its claim was deleted again) and is won at the next try.
    assert client.lrange(queue, 0, -1) == ["sent"]
    assert outcomes_noted(store, history) == {sent.id: "won"}
    assert noting_keys(client, prefix) == []
    client.delete(not_a_list)
    again = store.claim_and_push(
        [sent, refused],
        [[["RPUSH", queue, "sent"]], [["RPUSH", not_a_list, "refused"]]],
        node="a",
        notes=[history_note(history, sent), history_note(history, refused)],
    )
    assert again == [Outcome.LOST, Outcome.WON]
    assert outcomes_noted(store, history) == {sent.id: "won", refused.id: "won"}
    store.close()


def test_notes_are_written_when_redis_is_over_its_maxmemory_after_the_claim(
    own_redis: PrivateRedis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(own_redis.url, decode_responses=True)
    if int(admin.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("a script flagged allow-oom needs Redis 7")
    store = RedisStore(own_redis.url, prefix="beatless-test:")
    history = history_kind()
    run = store._run

    def filled(script: Any, calls: Any, then: Any = ()) -> list[Any]:
        """The claim scripts; then Redis over its maxmemory (as a push of a big message,
        or another client, may take it); then the notes scripts."""
        replies = run(script, calls)
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", str(used - 100_000))
        return replies + run(then[0][0], [(keys, args) for _, keys, args in then])

    monkeypatch.setattr(store, "_run", filled)
    won = firing(store.time_ms())

    with caplog.at_level(logging.WARNING):
        outcomes = store.claim_and_push(
            [won], [[["RPUSH", "queue", "won"]]], node="a", notes=[history_note(history, won)]
        )

    assert outcomes == [Outcome.WON]
    # A plain write is refused there: the notes were written because they may be.
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        admin.set("beatless-test:other", "refused")
    admin.config_set("maxmemory", "0")
    assert outcomes_noted(store, history) == {won.id: "won"}
    assert "was not written" not in caplog.text
    store.close()
    admin.close()


def test_notes_whose_claims_letters_are_gone_are_said_not_written(
    client: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisStore(URL, prefix=prefix)
    history = history_kind()
    run = store._run

    def evicting(script: Any, calls: Any, then: Any = ()) -> list[Any]:
        """The claim scripts, then their letters evicted, then the notes scripts."""
        replies = run(script, calls)
        for key in noting_keys(client, prefix):
            client.delete(key)
        return replies + run(then[0][0], [(keys, args) for _, keys, args in then])

    monkeypatch.setattr(store, "_run", evicting)
    now = server_now_ms(client)
    won = firing(now)

    with caplog.at_level(logging.WARNING):
        outcomes = store.claim_and_push([won], [[]], node="a", notes=[history_note(history, won)])

    assert outcomes == [Outcome.WON]
    assert store.read_notes([history]) == {history: {}}
    assert "the history of 1 claimed firing(s) was not written" in caplog.text
    assert "evicted" in caplog.text
    store.close()


def test_a_claim_with_notes_of_no_firing_it_decides_writes_nothing_and_says_nothing(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(URL, prefix=prefix)
    history = history_kind()
    now = server_now_ms(client)
    early = firing(now, release_ms=now + 60_000)

    with caplog.at_level(logging.WARNING):
        outcomes = store.claim_and_push(
            [early], [[]], node="a", notes=[history_note(history, early)]
        )

    assert outcomes == [Outcome.EARLY]
    assert store.read_notes([history]) == {history: {}}
    assert noting_keys(client, prefix) == []
    assert caplog.text == ""
    store.close()


def test_a_claim_script_unknown_to_the_server_is_run_again_and_then_its_notes(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(URL, prefix=prefix)
    history = history_kind()
    # A digest the server has never seen: NOSCRIPT, as after a restart or SCRIPT FLUSH.
    # The notes script after it in the pipeline ran first and found nothing to write.
    store._claim.sha = "0" * 40
    batch = [firing(server_now_ms(client)) for _ in range(3)]

    with caplog.at_level(logging.WARNING):
        outcomes = store.claim_and_push(
            batch, [[]] * 3, node="a", notes=[history_note(history, r) for r in batch]
        )

    assert outcomes == [Outcome.WON] * 3
    assert outcomes_noted(store, history) == dict.fromkeys((r.id for r in batch), "won")
    assert noting_keys(client, prefix) == []
    assert "was not written" not in caplog.text
    store.close()
