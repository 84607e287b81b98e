"""The NATS JetStream store against a real server: what the contract suite cannot see.

The shared server at 127.0.0.1:4222 is used with a bucket of the test's own (a random
name), and only that bucket is deleted afterwards. Cases that restart the server, wipe
its storage, need a password or run without JetStream start a private ``nats-server``
of their own on a free port and stop it by its pid.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("nats", reason="the nats store needs: pip install 'beatless[nats]'")

import nats
from fleet import assert_the_kill_was_survived, kill_one_of_three
from service_check import require_binary, require_service
from stores import NATS, NATS_URL, delete_nats_bucket, free_port

from beatless import Entry, Every, Firing, Schedule
from beatless.errors import ConfigError, StoreError, StoreUnavailable
from beatless.node.runs import NEVER_LATE_MS, RUN_RECORD_MEMORY_MS
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import run_lease_id
from beatless.stores import ClaimRequest, Outcome, open_store
from beatless.stores.base import TOLERANCE_MS, Note
from beatless.stores.nats._jetstream import BucketInfo, bucket_info, parse_stamp_ms
from beatless.stores.nats.store import DEFAULT_TTL, NATSStore

MAX_LATE_MS = 60_000
MEMORY_MS = 80_000
LEASE_MS = 5_000
TAG = "5eed7a95"
NODE = Path(__file__).with_name("node_process.py")


def firing(occurrence_ms: int, *, release_ms: int | None = None) -> ClaimRequest:
    id_ = uuid.uuid4().hex
    release = occurrence_ms if release_ms is None else release_ms
    return ClaimRequest(id_, f"test/{id_[:8]}", occurrence_ms, MAX_LATE_MS, MEMORY_MS, release, TAG)


def skipping(request: ClaimRequest) -> ClaimRequest:
    """The same firing, of an entry whose overlap policy is ``skip``."""
    return dataclasses.replace(request, run_id=run_lease_id(request.address))


def run_lease(address: str, now: int) -> ClaimRequest:
    """A worker's claim of ``address``'s run lease, as ``beatless.node.runs`` makes it."""
    return ClaimRequest(
        run_lease_id(address), address, now, NEVER_LATE_MS, RUN_RECORD_MEMORY_MS, now
    )


def now_ms() -> int:
    return int(time.time() * 1_000)


def admin(
    url: str, subject: str, payload: Any = None, headers: dict[str, str] | None = None
) -> Any:
    """One request to the server behind the store's back; a JSON reply is decoded."""

    async def run() -> Any:
        client = await nats.connect(url, max_reconnect_attempts=1)
        try:
            if isinstance(payload, bytes):
                body = payload
            else:
                body = b"" if payload is None else json.dumps(payload).encode()
            reply = await client.request(subject, body, timeout=5, headers=headers)
        finally:
            await client.close()
        try:
            return json.loads(reply.data)
        except ValueError:
            return reply

    return asyncio.run(run())


def create_stream(bucket: str, config: dict[str, Any]) -> None:
    """Make the bucket's stream as another client would; refused, the test stops here
    (else the store would make the bucket itself, its own way)."""
    created = admin(NATS_URL, f"$JS.API.STREAM.CREATE.KV_{bucket}", config)
    assert "error" not in created, created


def stream_info(bucket: str, url: str = NATS_URL) -> dict[str, Any]:
    info: dict[str, Any] = admin(url, f"$JS.API.STREAM.INFO.KV_{bucket}")
    return info


def value_of(bucket: str, key: str, url: str = NATS_URL) -> tuple[str, int]:
    """The value of a key as stored (bytes that are not UTF-8 kept as surrogates), and
    its stamp on the server's clock."""
    reply = admin(
        url, f"$JS.API.STREAM.MSG.GET.KV_{bucket}", {"last_by_subj": f"$KV.{bucket}.{key}"}
    )
    message = reply["message"]
    return base64.b64decode(message.get("data", "")).decode(
        errors="surrogateescape"
    ), parse_stamp_ms(message["time"])


@pytest.fixture
def bucket() -> Iterator[str]:
    """A bucket of the test's own on the shared server; deleted afterwards, no other."""
    require_service(*NATS)
    name = f"beatless_test_{uuid.uuid4().hex[:12]}"
    yield name
    delete_nats_bucket(name)


@pytest.fixture
def store(bucket: str) -> Iterator[NATSStore]:
    opened = NATSStore(NATS_URL, bucket=bucket)
    yield opened
    opened.close()


class PrivateNats:
    """A ``nats-server`` of the test's own on a free port, storing in ``directory``."""

    def __init__(self, directory: Path, *, jetstream: bool = True, auth: str = "") -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        if not os.path.exists(binary):
            require_binary("nats-server is not installed; this case starts a private server")
        self.args = [binary, "-a", "127.0.0.1", "-p", str(free_port()), "-sd", str(directory)]
        self.args += ["-js"] if jetstream else []
        self.args += auth.split()
        self.directory = directory
        self.port = int(self.args[4])
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, userinfo: str = "") -> str:
        return f"nats://{userinfo}127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while not _answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"private nats-server on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _answers(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            return sock.recv(4).startswith(b"INFO")
    except OSError:
        return False


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[PrivateNats]:
    server = PrivateNats(tmp_path / "js")
    server.start()
    yield server
    server.stop()


# -- what is written, on whose clock -------------------------------------------------------


def test_a_pending_claim_is_a_versioned_value_whose_lease_ends_on_the_server_clock(
    store: NATSStore, bucket: str
) -> None:
    request = firing(store.time_ms())

    assert store.claim([request], node="node|1", lease_ms=LEASE_MS) == [Outcome.WON]

    value, stamp = value_of(bucket, f"claim.{request.id}")
    version, state, until, memory, tag, node = value.split("|", 5)
    assert (version, state, memory, tag, node) == ("v=1", "pending", str(MEMORY_MS), TAG, "node|1")
    # The lease starts at the server's clock read at the start of the call: just before
    # the claim's own stamp.
    assert stamp - 1_000 <= int(until) - LEASE_MS <= stamp


def test_a_claim_value_with_a_revision_reads_as_another_nodes_claim_to_an_earlier_beatless(
    store: NATSStore, bucket: str
) -> None:
    live, plain = dataclasses.replace(firing(store.time_ms()), revision=41), firing(store.time_ms())
    assert store.claim([live, plain], node="a", lease_ms=LEASE_MS) == [Outcome.WON] * 2
    assert store.commit([live.id], node="a") == [True]
    # An earlier beatless splits the value in six and requires v=1: its node is then a
    # name none of its nodes has, so it judges the claim another node's, as it is.
    value, _ = value_of(bucket, f"claim.{live.id}")
    version, state, _until, _memory, _tag, node = value.split("|", 5)
    assert (version, state, node) == ("v=1", "committed", "a\x1f41")
    value, _ = value_of(bucket, f"claim.{plain.id}")
    assert value.split("|", 5)[5] == "a"  # no revision: written as an earlier one did
    records = store.claim_records([live.id, plain.id])
    assert {i: (r.node, r.revision) for i, r in records.items()} == {
        live.id: ("a", 41),
        plain.id: ("a", None),
    }


def test_commit_keeps_the_claim_for_its_memory_and_release_ends_the_lease_at_once(
    store: NATSStore, bucket: str
) -> None:
    committed, released = firing(store.time_ms()), firing(store.time_ms())
    store.claim([committed, released], node="a", lease_ms=LEASE_MS)

    assert store.commit([committed.id], node="a") == [True]
    store.release([released.id], node="a")

    value, stamp = value_of(bucket, f"claim.{committed.id}")
    assert value.startswith("v=1|committed|")
    assert stamp - 1_000 <= int(value.split("|")[2]) - MEMORY_MS <= stamp
    value, stamp = value_of(bucket, f"claim.{released.id}")
    assert value.startswith("v=1|pending|")
    assert stamp - 1_000 <= int(value.split("|")[2]) + 1 <= stamp
    assert store.claim([released], node="b", lease_ms=LEASE_MS) == [Outcome.TAKEOVER]


def test_time_ms_is_the_stamp_the_server_gives_a_message_written_for_it(
    store: NATSStore, bucket: str
) -> None:
    before = now_ms()
    reading = store.time_ms()

    _value, stamp = value_of(bucket, "clock")
    assert reading == stamp
    assert before - 1_000 < reading < now_ms() + 1_000


def test_a_late_claim_is_refused_on_the_server_clock_and_writes_no_claim(
    store: NATSStore, bucket: str
) -> None:
    late = firing(store.time_ms() - MAX_LATE_MS - TOLERANCE_MS - 1_000)
    early = firing(store.time_ms(), release_ms=store.time_ms() + TOLERANCE_MS + 5_000)

    assert store.claim([late, early], node="a", lease_ms=LEASE_MS) == [Outcome.LATE, Outcome.EARLY]

    assert stream_info(bucket)["state"]["num_subjects"] == 1  # the clock key only


def test_a_value_it_cannot_read_fails_only_its_own_firing_and_is_never_overwritten(
    store: NATSStore, bucket: str
) -> None:
    now = store.time_ms()
    foreign, fine = firing(now), firing(now)
    for junk in (b"another program's value", b"v=2|pending|1|2||a", b"\xff\xfe"):
        admin(NATS_URL, f"$KV.{bucket}.claim.{foreign.id}", junk)

        assert store.claim([foreign, fine], node="a", lease_ms=LEASE_MS) == [
            Outcome.CORRUPT,
            Outcome.WON,
        ]
        assert store.commit([foreign.id], node="a") == [False]
        store.release([foreign.id], node="a")
        stored, _stamp = value_of(bucket, f"claim.{foreign.id}")
        assert stored == junk.decode(errors="surrogateescape")


def test_a_deleted_claim_key_is_free_again(store: NATSStore, bucket: str) -> None:
    request = firing(store.time_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    admin(NATS_URL, f"$KV.{bucket}.claim.{request.id}", b"", headers={"KV-Operation": "DEL"})

    assert store.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.WON]


# -- renewal and run leases ----------------------------------------------------------------


def test_a_holder_s_reclaim_renews_its_lease_to_lease_ms_from_the_call_on_the_server_clock(
    store: NATSStore, bucket: str
) -> None:
    request = firing(store.time_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    first, _stamp = value_of(bucket, f"claim.{request.id}")
    time.sleep(0.05)

    assert store.claim([request], node="a", lease_ms=2 * LEASE_MS) == [Outcome.WON]

    value, stamp = value_of(bucket, f"claim.{request.id}")
    _version, state, until, memory, tag, node = value.split("|", 5)
    assert (state, memory, tag, node) == ("pending", str(MEMORY_MS), TAG, "a")
    assert stamp - 1_000 <= int(until) - 2 * LEASE_MS <= stamp
    assert int(until) > int(first.split("|")[2])
    with NATSStore(NATS_URL, bucket=bucket) as other:
        assert other.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.HELD]


def test_reading_kept_notes_by_key_costs_one_request_a_key_whatever_the_kind_holds(
    store: NATSStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from beatless.stores.base import KeptNote
    from beatless.stores.nats._jetstream import NoteStream

    store.keep_notes([KeptNote("revisions", str(n), f"value {n}") for n in range(1, 301)])
    store.delete_kept("revisions", ["7"])
    assert len(store.read_kept("revisions")) == 299

    async def whole_kind(*_args: object) -> None:
        raise AssertionError("read every note of the kind to find a few keys")

    # A node's sync asks for the head's next revisions only: not the 300 the kind holds
    # (a read that grew with every revision made 1,000 edits too slow for ten nodes).
    monkeypatch.setattr(NoteStream, "snapshot", whole_kind)
    sent = store.requests
    assert store.read_kept("revisions", ["300", "7", "301", "300"]) == {"300": "value 300"}
    assert store.requests - sent == 3  # one per distinct key asked; deleted or absent: none


def test_a_firing_whose_address_runs_is_committed_for_its_memory_at_one_read_more(
    store: NATSStore, bucket: str
) -> None:
    now = store.time_ms()
    request, idle = skipping(firing(now)), skipping(firing(now))
    with NATSStore(NATS_URL, bucket=bucket) as worker:
        run = run_lease(request.address, now)
        assert worker.claim([run], node="w", lease_ms=LEASE_MS) == [Outcome.WON]
    sent = store.requests

    assert store.claim([request, idle], node="a", lease_ms=LEASE_MS) == [
        Outcome.OVERLAP,
        Outcome.WON,
    ]

    # The clock and the bucket's info; a read of the run lease and a create each.
    assert store.requests - sent == 2 + 2 * 2
    value, stamp = value_of(bucket, f"claim.{request.id}")
    _version, state, until, memory, tag, node = value.split("|", 5)
    assert (state, memory, tag, node) == ("committed", str(MEMORY_MS), TAG, "a")
    assert stamp - 1_000 <= int(until) - MEMORY_MS <= stamp


def test_a_run_lease_value_it_cannot_read_is_no_run_in_progress(
    store: NATSStore, bucket: str
) -> None:
    request = skipping(firing(store.time_ms()))
    admin(NATS_URL, f"$KV.{bucket}.claim.{request.run_id}", b"another program's value")

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]


# -- the bucket: memory, rule 5, identity --------------------------------------------------


def test_the_bucket_is_created_with_the_ttl_as_max_age_and_cannot_be_purged(
    store: NATSStore, bucket: str
) -> None:
    store.claim([firing(store.time_ms())], node="a", lease_ms=LEASE_MS)

    info = stream_info(bucket)
    config = info["config"]
    assert config["max_age"] == 300 * 10**9
    assert (config["deny_purge"], config["deny_delete"], config["allow_rollup_hdrs"]) == (
        True,
        True,
        False,
    )
    assert config["max_msgs_per_subject"] == 1
    assert store.epoch is not None
    assert re.fullmatch(r"beatless claims \(format 1\), epoch [0-9a-f]{32}", config["description"])
    assert store.epoch.started_ms == parse_stamp_ms(info["created"])
    purge = admin(NATS_URL, f"$JS.API.STREAM.PURGE.KV_{bucket}")
    assert purge["error"]["description"] == "stream purge not permitted"


def test_remembers_is_the_ttl_so_rule_5_is_checked_against_it(bucket: str) -> None:
    schedule = Schedule([Entry(name="e", task="t", trigger=Every(300), jitter=30)])
    default, short = NATSStore(NATS_URL, bucket=bucket), NATSStore(NATS_URL, ttl="60s")

    assert default.remembers == DEFAULT_TTL == timedelta(minutes=5)
    assert schedule.check_store(default.remembers, default.name) == []
    (error,) = schedule.check_store(short.remembers, short.name)
    assert "entry 'e'" in error
    assert "1m" in error or "60" in error
    for opened in (default, short):
        opened.close()


def test_a_bucket_made_with_a_shorter_ttl_is_lengthened_to_a_later_one(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``check --store ...`` with the default 5 minutes, then the nodes with ``&ttl=10m``."""
    caplog.set_level(logging.WARNING, logger="beatless")
    short = NATSStore(NATS_URL, bucket=bucket, ttl="90s")
    assert short.claim([firing(now_ms())], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    store = NATSStore(NATS_URL, bucket=bucket, ttl="5m")

    assert store.claim([firing(now_ms())], node="b", lease_ms=LEASE_MS) == [Outcome.WON]

    assert stream_info(bucket)["config"]["max_age"] == 300 * 10**9
    assert "kept claims for 1m30s, less than the ttl 5m: it keeps them for 5m" in caplog.text
    # The same bucket, its claims kept: not a store that forgot, for either node.
    assert store.epoch == short.epoch
    assert short.claim([firing(now_ms())], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert short.epoch == store.epoch
    assert stream_info(bucket)["config"]["max_age"] == 300 * 10**9  # never shortened
    for opened in (short, store):
        opened.close()


def test_a_bucket_left_shorter_than_the_ttl_is_refused_with_the_numbers_and_the_fix() -> None:
    """What a node says when the bucket could not be lengthened (a user without the right
    to update the stream): the numbers, and the command that lengthens it."""
    store = NATSStore(NATS_URL, bucket="claims", ttl="5m")
    info = BucketInfo(
        created="2026-01-01T00:00:00Z",
        created_ms=0,
        description="",
        max_age_ms=90_000,
        replicas=1,
        direct=True,
        drops_old=False,
        purgeable=False,
        last_ms=None,
        server_ms=None,
    )
    with pytest.raises(StoreError, match="keeps claims for 1m30s, less than the ttl 5m") as caught:
        store._check(info)

    assert not isinstance(caught.value, StoreUnavailable)
    assert "nats stream edit KV_claims --max-age 5m" in str(caught.value)
    store.close()


def test_rule_5_on_nats_says_which_ttl_would_do() -> None:
    schedule = Schedule([Entry(name="e", task="t", trigger=Every(600), jitter="2m", max_late="5m")])
    store = NATSStore(NATS_URL, ttl="5m")
    (error,) = schedule.check_store(store.remembers, store.name, lengthen=store.lengthen_memory)
    assert "7m10s must be under what nats remembers (5m)" in error
    assert "open the store with ?ttl=8m (or &ttl=8m after other options" in error
    store.close()


def test_a_bucket_made_without_beatless_is_used_and_its_purges_warned_of(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="beatless")
    config = {"name": f"KV_{bucket}", "subjects": [f"$KV.{bucket}.>"], "max_age": 600 * 10**9}
    config |= {"max_msgs_per_subject": 1, "allow_rollup_hdrs": True, "allow_direct": True}
    create_stream(bucket, config)
    store = NATSStore(NATS_URL, bucket=bucket)

    assert store.claim([firing(store.time_ms())], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    assert "allows purges or roll-ups" in caplog.text
    assert store.epoch is not None
    assert store.epoch.started_ms == parse_stamp_ms(stream_info(bucket)["created"])
    store.close()


def test_a_bucket_with_a_limit_that_discards_old_claims_is_refused(bucket: str) -> None:
    config = {"name": f"KV_{bucket}", "subjects": [f"$KV.{bucket}.>"], "max_age": 600 * 10**9}
    config |= {"max_msgs": 1_000, "discard": "old"}
    create_stream(bucket, config)
    store = NATSStore(NATS_URL, bucket=bucket)

    with pytest.raises(StoreError, match="discards old messages"):
        store.time_ms()
    store.close()


def test_a_deleted_bucket_is_created_again_and_a_store_object_that_saw_it_reports_forgotten(
    store: NATSStore, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="beatless")
    request = firing(store.time_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.commit([request.id], node="a") == [True]
    seen = store.epoch

    delete_nats_bucket(bucket)

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    assert store.epoch is not None
    assert store.epoch != seen
    assert "lost its memory" in caplog.text
    # Written committed: no other node sends it either; a new store object adopts the
    # new epoch with no cut-off, and a firing released after the horizon is won.
    other = NATSStore(NATS_URL, bucket=bucket)
    assert other.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.LOST]
    assert other.epoch == store.epoch
    horizon = store.epoch.started_ms + TOLERANCE_MS
    later = firing(horizon - 5_000, release_ms=horizon)
    assert store.claim([later], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    other.close()


def test_a_commit_does_not_adopt_a_changed_epoch(store: NATSStore, bucket: str) -> None:
    request = firing(store.time_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    seen = store.epoch
    delete_nats_bucket(bucket)

    assert store.commit([request.id], node="a") == [False]

    assert store.epoch == seen
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]


def test_a_server_restart_keeps_the_claims_and_the_epoch(private_nats: PrivateNats) -> None:
    store = NATSStore(private_nats.url(), bucket="restart")
    request = firing(store.time_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.commit([request.id], node="a") == [True]
    seen = store.epoch

    private_nats.stop()
    with pytest.raises(StoreUnavailable):
        store.claim([request], node="a", lease_ms=LEASE_MS)
    private_nats.start()

    assert store.claim([request], node="b", lease_ms=LEASE_MS) == [Outcome.LOST]
    assert store.epoch == seen
    store.close()


def test_a_server_that_lost_its_storage_gives_forgotten(private_nats: PrivateNats) -> None:
    store = NATSStore(private_nats.url(), bucket="wiped")
    request = firing(store.time_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    assert store.commit([request.id], node="a") == [True]

    private_nats.stop()
    shutil.rmtree(private_nats.directory)
    private_nats.start()

    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.FORGOTTEN]
    store.close()


# -- batches and round trips --------------------------------------------------------------


def test_a_batch_of_fresh_firings_is_one_create_each_sent_together(
    store: NATSStore,
) -> None:
    now = store.time_ms()
    requests = [firing(now) for _ in range(1_000)]
    sent = store.requests

    started = time.monotonic()
    assert store.claim(requests, node="a", lease_ms=60_000) == [Outcome.WON] * 1_000
    claimed = time.monotonic() - started
    assert store.commit([r.id for r in requests], node="a") == [True] * 1_000

    # The clock and the bucket's info, one create per firing; a commit needs no read.
    assert store.requests - sent == 2 + 1_000 + 2 + 1_000
    assert claimed < 5.0


def test_a_node_that_loses_reads_once_and_writes_nothing(store: NATSStore, bucket: str) -> None:
    now = store.time_ms()
    requests = [firing(now) for _ in range(50)]
    assert store.claim(requests, node="a", lease_ms=60_000) == [Outcome.WON] * 50
    other = NATSStore(NATS_URL, bucket=bucket)
    other.time_ms()
    sent = other.requests

    assert other.claim(requests, node="b", lease_ms=60_000) == [Outcome.HELD] * 50

    assert other.requests - sent == 2 + 50 * 2  # a refused create and a read each
    other.close()


def test_threads_sharing_one_store_object_each_get_their_own_answers(store: NATSStore) -> None:
    now = store.time_ms()
    batches = [[firing(now) for _ in range(20)] for _ in range(6)]
    results: list[list[Outcome]] = [[] for _ in batches]

    def run(index: int) -> None:
        results[index] = store.claim(batches[index], node=f"n{index}", lease_ms=60_000)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert results == [[Outcome.WON] * 20] * 6


# -- probe, connection, failures ----------------------------------------------------------


def test_probe_writes_reads_back_and_deletes_a_key_and_leaves_the_claims(
    store: NATSStore, bucket: str
) -> None:
    request = firing(store.time_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]

    store.probe()

    subjects = admin(NATS_URL, f"$JS.API.STREAM.INFO.KV_{bucket}", {"subjects_filter": ">"})
    probes = [s for s in subjects["state"]["subjects"] if ".probe." in s]
    assert len(probes) == 1
    reply = admin(NATS_URL, f"$JS.API.DIRECT.GET.KV_{bucket}.{probes[0]}")
    assert reply.headers["KV-Operation"] == "DEL"
    assert store.commit([request.id], node="a") == [True]


@pytest.mark.serial
def test_a_server_at_a_closed_port_is_unavailable_quickly_and_tried_again_later(
    bucket: str,
) -> None:
    port = free_port()
    store = NATSStore(f"nats://127.0.0.1:{port}", bucket=bucket, timeout=1)
    started = time.monotonic()

    with pytest.raises(StoreUnavailable, match="cannot connect"):
        store.claim([firing(now_ms())], node="a", lease_ms=LEASE_MS)
    with pytest.raises(StoreUnavailable):
        store.probe()

    assert time.monotonic() - started < 5.0
    store.close()


def test_wrong_password_is_a_store_error_that_does_not_show_it(tmp_path: Path) -> None:
    server = PrivateNats(tmp_path / "js", auth="--user app --pass s3cret-pass")
    server.start()
    try:
        wrong = open_store(server.url("app:hunter2-secret@"), namespace="default")
        with pytest.raises(StoreError) as caught:
            wrong.probe()
        assert not isinstance(caught.value, StoreUnavailable)
        assert "Authorization Violation" in str(caught.value)
        assert "hunter2" not in str(caught.value)
        assert "***" in str(caught.value)
        right = open_store(server.url("app:s3cret-pass@"), namespace="default")
        right.probe()
        for opened in (wrong, right):
            opened.close()
    finally:
        server.stop()


def test_a_user_denied_the_bucket_s_subjects_gets_a_store_error_naming_them(
    tmp_path: Path,
) -> None:
    config = tmp_path / "nats.conf"
    config.write_text(
        "authorization { users = [ {user: app, password: pw, permissions: {publish: {deny: "
        '["$KV.>"]}}} ] }\n'
    )
    server = PrivateNats(tmp_path / "js", auth=f"-c {config}")
    server.start()
    try:
        store = NATSStore(server.url("app:pw@"), timeout=1)
        with pytest.raises(StoreError, match=r"(?i)permissions violation") as caught:
            store.probe()
        assert not isinstance(caught.value, StoreUnavailable)
        assert "$KV.beatless_default.>" in str(caught.value)
        store.close()
    finally:
        server.stop()


def test_a_server_without_jetstream_is_a_store_error_saying_so(tmp_path: Path) -> None:
    server = PrivateNats(tmp_path / "js", jetstream=False)
    server.start()
    try:
        store = NATSStore(server.url(), timeout=2)
        with pytest.raises(StoreError, match="JetStream") as caught:
            store.probe()
        assert not isinstance(caught.value, StoreUnavailable)
        store.close()
    finally:
        server.stop()


def test_passwords_and_tokens_are_masked_in_repr_and_errors() -> None:
    port = free_port()
    with_password = open_store(
        f"nats://app:hunter2-secret@127.0.0.1:{port}/?timeout=1", namespace="default"
    )
    with_token = open_store(
        f"nats://s3cr3t-token@127.0.0.1:{port},127.0.0.1:{port}?timeout=1", namespace="default"
    )

    assert (
        repr(with_password)
        == f"NATSStore('nats://app:***@127.0.0.1:{port}', bucket='beatless_default')"
    )
    assert "s3cr3t" not in repr(with_token)
    for opened in (with_password, with_token):
        with pytest.raises(StoreUnavailable) as caught:
            opened.time_ms()
        assert "hunter2" not in str(caught.value)
        assert "s3cr3t" not in str(caught.value)
        opened.close()


def test_close_closes_the_connection_and_the_thread_and_a_closed_store_refuses_calls(
    store: NATSStore,
) -> None:
    store.time_ms()
    store.read_notes(["k"])
    links = [store._link, store._notes_link]
    assert all(link.alive() for link in links)

    store.close()
    store.close()

    assert not any(link.alive() for link in links)
    with pytest.raises(StoreError, match="closed"):
        store.time_ms()


@pytest.mark.serial
def test_claims_and_commits_never_wait_for_a_notes_read(store: NATSStore) -> None:
    """A read of many notes (or one on a slow server) has a connection and a lock of its
    own, so a claim whose lease is running is not held up by it: a commit that waited
    past the lease would be refused, and another node could send the firing again. Here
    a read is made to take 2 s."""
    store.post([Note("k", "n", "v", 60_000)])
    reading = threading.Event()
    read_kind = store._read_kind

    async def slow_read_kind(stream: Any, kind: str) -> dict[str, str]:
        reading.set()
        await asyncio.sleep(2)
        return await read_kind(stream, kind)

    store._read_kind = slow_read_kind  # type: ignore[method-assign]
    reader = threading.Thread(target=store.read_notes, args=(["k"],))
    reader.start()
    assert reading.wait(10)
    began = time.monotonic()
    request = firing(now_ms())
    (outcome,) = store.claim([request], node="a", lease_ms=5_000)
    assert outcome is Outcome.WON
    assert store.commit([request.id], node="a") == [True]
    took = time.monotonic() - began
    reader.join(10)

    assert took < 1.0, f"claim and commit took {took:.2f}s behind a notes read"


@pytest.mark.serial
def test_a_commit_never_waits_for_a_long_claim_of_another_thread(bucket: str) -> None:
    """A node's board claims missed-firing markers from a thread of its own through the
    store object its loop commits with: their requests share the one connection, so the
    loop's commit, whose lease is running, is made while that claim is still under way,
    not after it. Here the board's claim waits for the test to let it go."""
    store = NATSStore(NATS_URL, bucket=bucket, timeout=2)
    request, marker = firing(now_ms()), firing(now_ms())
    assert store.claim([request], node="a", lease_ms=LEASE_MS) == [Outcome.WON]
    under_way, let_go, left = threading.Event(), threading.Event(), threading.Event()
    claim_all = store._claim_all

    async def slow_claim_all(kv: Any, requests: Any, *args: Any) -> Any:
        try:
            if any(r.id == marker.id for r in requests):
                under_way.set()
                while not let_go.is_set():
                    await asyncio.sleep(0.01)
            return await claim_all(kv, requests, *args)
        finally:
            left.set()

    store._claim_all = slow_claim_all  # type: ignore[method-assign]
    done: list[list[Outcome]] = []
    sweep = threading.Thread(
        target=lambda: done.append(store.claim([marker], node="a", lease_ms=LEASE_MS))
    )
    sweep.start()
    assert under_way.wait(10)
    committed = store.commit([request.id], node="a")
    waited = left.is_set()
    let_go.set()
    sweep.join(10)
    store.close()

    assert not waited, "the commit waited for the other thread's claim to end"
    assert committed == [True]
    assert done == [[Outcome.WON]]


# -- URLs and options ---------------------------------------------------------------------


def test_open_store_routes_nats_urls_without_connecting() -> None:
    port = free_port()
    store = open_store(f"nats://127.0.0.1:{port}", namespace="app")
    named = open_store(
        "nats://h1:4222,h2:4223/?bucket=claims&ttl=10m&timeout=2s&replicas=3",
        namespace="default",
        ttl="15m",
    )

    assert isinstance(store, NATSStore)
    assert isinstance(named, NATSStore)
    assert store.name == "nats"
    assert store.bucket == "beatless_app"
    assert (named.bucket, named.ttl, named.timeout, named.replicas) == (
        "claims",
        timedelta(minutes=15),
        2.0,
        3,
    )
    assert named._servers == ["nats://h1:4222", "nats://h2:4223"]
    assert named.remembers == timedelta(minutes=15)
    for opened in (store, named):
        opened.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nats://127.0.0.1:4222/claims", "write nats://host:4222"),
        ("nats://127.0.0.1:4222?ttl=5m&bucket=a&retries=3", "unknown option retries"),
        ("nats://127.0.0.1:4222?bucket=has.dot", "letters, digits, - and _ only"),
        ("nats://127.0.0.1:4222?ttl=0s", "ttl must be positive"),
        ("nats://127.0.0.1:4222?ttl=soon", "ttl"),
        ("nats://127.0.0.1:4222?replicas=7", "replicas must be 1 to 5"),
        ("nats://", "write nats://host:4222"),
    ],
)
def test_a_bad_url_is_a_config_error_that_says_what_to_write(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_store(url, namespace="default")


def test_a_namespace_that_cannot_name_a_bucket_asks_for_one() -> None:
    with pytest.raises(ConfigError, match=r"name one with \?bucket="):
        open_store("nats://127.0.0.1:4222", namespace="team.reports")
    store = open_store("nats://127.0.0.1:4222?bucket=reports", namespace="team.reports")
    assert isinstance(store, NATSStore)
    assert store.bucket == "reports"
    store.close()


def test_a_firing_id_that_cannot_be_a_key_is_refused(store: NATSStore) -> None:
    request = ClaimRequest("has space", "ns/e", now_ms(), MAX_LATE_MS, MEMORY_MS, now_ms())

    with pytest.raises(ConfigError, match="cannot be a key"):
        store.claim([request], node="a", lease_ms=LEASE_MS)
    with pytest.raises(ConfigError, match="cannot be a key"):
        store.claim([dataclasses.replace(firing(now_ms()), run_id="a b")], node="a", lease_ms=1)


def test_missing_driver_raises_config_error_with_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "nats", None)

    with pytest.raises(ConfigError, match=r"pip install 'beatless\[nats\]'"):
        NATSStore("nats://127.0.0.1:4222")


def test_a_server_that_tells_its_time_in_the_stream_info_is_read_without_a_clock_write() -> None:
    # Servers newer than 2.9 put their time ("ts") in the stream info; 2.9 does not.
    info = {
        "config": {"description": "d", "max_age": 300 * 10**9, "deny_purge": True},
        "created": "2026-12-01T11:00:00.000000001Z",
        "state": {"messages": 1, "last_ts": "2026-12-01T11:03:50.5Z"},
        "ts": "2026-12-01T11:03:51.25Z",
    }
    told = bucket_info(info)
    assert (told.server_ms, told.last_ms) == (1796123031250, 1796123030500)
    assert told.max_age_ms == 300_000
    assert not told.purgeable
    store = NATSStore(NATS_URL)
    calls: list[bool] = []

    class Told:
        async def reading(self, _new: object, *, write_clock: bool) -> BucketInfo:
            calls.append(write_clock)
            return told

    first = asyncio.run(store._state(Told()))  # type: ignore[arg-type]
    second = asyncio.run(store._state(Told()))  # type: ignore[arg-type]

    assert first.now_ms == second.now_ms == 1796123031250
    assert calls == [True, False]
    store.close()


def test_server_stamps_are_read_to_the_millisecond() -> None:
    assert parse_stamp_ms("2026-12-01T11:03:50.663014776Z") == 1796123030663
    assert parse_stamp_ms("2026-12-01T11:03:50Z") == 1796123030000
    assert parse_stamp_ms("2026-12-01T12:03:50.5+01:00") == 1796123030500


# -- the two-phase path over the store ------------------------------------------------------


def test_two_schedulers_whose_broker_fails_often_send_every_firing_exactly_once(
    bucket: str,
) -> None:
    tenants = [f"t{i}" for i in range(20)]
    schedule = Schedule([Entry(name="fan", task="t", trigger=Every(1), tenants=tenants)])
    sent: list[Firing] = []
    lock = threading.Lock()
    failures = iter([True, False, False] * 10_000)

    def enqueue(firing: Firing) -> None:
        with lock:
            if next(failures):
                raise ConnectionError("the broker refused the message")
            sent.append(firing)

    stores = [NATSStore(NATS_URL, bucket=bucket) for _ in range(2)]
    nodes = [
        Scheduler(schedule, store=store, enqueue=enqueue, node=f"n{i}")
        for i, store in enumerate(stores)
    ]
    started = time.time()
    # Seconds 2 to 5 after the start, each of its 20 firings once. The nodes run until
    # those are all sent (a starved machine may run them seconds behind) or 30 s pass.
    window = range(int(started) + 2, int(started) + 6)

    def seen() -> Counter[int]:
        with lock:
            return Counter(f.occurrence_ms // 1_000 for f in sent)

    for node in nodes:
        node.start()
    while time.time() < started + 30 and any(seen()[s] < len(tenants) for s in window):
        time.sleep(0.2)
    time.sleep(1)  # a second copy, were one sent, has time to show
    for node in nodes:
        node.stop(timeout=5)
    for store in stores:
        store.close()

    counts = Counter(f.id for f in sent)
    assert max(counts.values()) == 1
    assert all(seen()[second] == len(tenants) for second in window), seen()


# -- real node processes, one killed ------------------------------------------------------


@pytest.mark.slow
def test_three_node_processes_one_killed_win_every_occurrence_exactly_once(
    bucket: str, tmp_path: Path
) -> None:
    """Three nodes for 45 s (a pending claim of the killed node is taken over after the
    30 s lease), n0 killed with SIGKILL after 10 s: every occurrence of the window both
    survivors covered, the kill included, exactly once."""
    url = f"{NATS_URL}/?bucket={bucket}"
    run = kill_one_of_three(url, tmp_path, seconds=45, kill_at_s=10, victim=0, squatter=False)
    assert_the_kill_was_survived(run)
