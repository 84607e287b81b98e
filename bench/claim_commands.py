"""Redis commands per claim, with and without a live revision in the claim.

    python bench/claim_commands.py [--batches 20] [--size 1 --size 100]

Starts a private ``redis-server`` (no persistence) on a free port, so that no other
client's commands are counted, and claims batches of fresh firings through
:class:`~beatless.stores.redis.store.RedisStore`: without a revision (a node with
``live=False``), with the node's revision in a namespace without live entries, and with
a namespace whose revisions the node is current with. Prints, per case and batch size,
the round trips (``EVALSHA``) and the commands Redis ran (``INFO commandstats``, which
counts the commands of a script too) per claim call and per firing. A beatless without
live checks in the claim has no revision to send: its figures are those of the first
case.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import fields
from typing import Any

import redis

from beatless.stores.base import ClaimRequest, KeptNote
from beatless.stores.redis.store import RedisStore

LIVE = "revision" in {f.name for f in fields(ClaimRequest)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def commandstats(client: Any) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def requests(namespace: str, size: int, now: int, revision: int | None) -> list[ClaimRequest]:
    extra = {"revision": revision} if LIVE else {}
    return [
        ClaimRequest(str(uuid.uuid4()), f"{namespace}/e", now, 60_000, 80_000, now, **extra)
        for _ in range(size)
    ]


def measure(
    store: RedisStore, client: Any, namespace: str, *, size: int, batches: int, revision: int | None
) -> dict[str, float]:
    store.claim(requests(namespace, size, store.time_ms(), revision), node="n", lease_ms=30_000)
    before = commandstats(client)
    for _ in range(batches):
        store.claim(requests(namespace, size, store.time_ms(), revision), node="n", lease_ms=30_000)
    ran = commandstats(client) - before
    ran.pop("info", None)
    total = sum(ran.values())
    return {
        "round_trips_per_call": ran["evalsha"] / batches,
        "commands_per_call": total / batches,
        "commands_per_firing": total / batches / size,
        "hget_per_call": ran["hget"] / batches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--size", type=int, action="append")
    args = parser.parse_args()
    port = free_port()
    binary = shutil.which("redis-server") or "redis-server"
    with tempfile.TemporaryDirectory() as directory:
        server = subprocess.Popen(
            [binary, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", directory],
            stdout=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(port=port, decode_responses=True)
            for _ in range(100):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            store = RedisStore(client, namespace="bench")
            current = "withlive"
            note = '{"v":1,"number":1,"fence_ms":0}'
            store.keep_notes([KeptNote(f"beatless.live/{current}/revisions", "1", note)])
            cases = [("no revision (live off)", "plain", None)]
            if LIVE:
                cases += [
                    ("revision 0, no live entries", "empty", 0),
                    ("current revision 1", current, 1),
                ]
            print(f"beatless live checks in the claim: {'yes' if LIVE else 'no'}")
            for size in args.size or [1, 100]:
                for label, namespace, revision in cases:
                    figures = measure(
                        store, client, namespace, size=size, batches=args.batches, revision=revision
                    )
                    shown = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
                    print(f"batch {size:>4}, {label:<28} {shown}")
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
