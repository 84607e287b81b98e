"""Redis commands per claim, with and without a live revision in the claim; and the
commands and Redis CPU of a steady firing on the atomic path.

    python bench/claim_commands.py [--batches 20] [--size 1 --size 100]
    python bench/claim_commands.py --steady 15 --steady 5   # firings per script

Starts a private ``redis-server`` (no persistence) on a free port, so that no other
client's commands are counted, and claims batches of fresh firings through
:class:`~beatless.stores.redis.store.RedisStore`: without a revision (a node with
``live=False``), with the node's revision in a namespace without live entries, and with
a namespace whose revisions the node is current with. Prints, per case and batch size,
the round trips (``EVALSHA``) and the commands Redis ran (``INFO commandstats``, which
counts the commands of a script too) per claim call and per firing. A beatless without
live checks in the claim has no revision to send: its figures are those of the first
case.

``--steady B`` (repeatable) measures the atomic path as a steady fleet drives it: scripts
of ``B`` firings each (about 15 per script with 3 nodes on 46 firings a second, 5 with
10), each firing of one of 100 addresses, won, pushed (an ``LPUSH`` of a 1.4 kB message)
and noted in its address's history (a note of about 300 bytes, as the node writes it),
after a warm-up that fills every address's history to its bound. It prints the commands
Redis ran per firing (``INFO commandstats``, the script's own included), the time Redis
spent in the scripts per firing (their ``usec``) and the server's CPU per firing (``INFO
cpu``, user + system, over the same window: what the machine's other work does not
inflate); then, over as many scripts again with every command in the slow log, the time
of the claim script and of the notes script pipelined after it, per firing (``logged_``:
the slow log adds its own cost, so compare them with each other and with another
build's, not with the figures before them).
"""

from __future__ import annotations

import argparse
import json
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

from beatless.stores.base import ClaimRequest, KeptNote, Note
from beatless.stores.redis.store import RedisStore

LIVE = "revision" in {f.name for f in fields(ClaimRequest)}
LOGGED = "logged" in {f.name for f in fields(Note)}


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


MESSAGE = json.dumps({"body": "x" * 1_000, "headers": {"h": "y" * 300}})
"""A message of about the size Celery's Redis transport pushes for a task without args."""
ADDRESSES = 100
HISTORY_KEEP = 50


def history_note(address: str, request: ClaimRequest) -> Note:
    """The history note a node gives the claim script for ``request``, as it writes it."""
    value = json.dumps(
        {
            "id": request.id,
            "entry": address.rsplit("/", 1)[-1],
            "tenant": None,
            "occurrence_ms": request.occurrence_ms,
            "release_ms": request.release_ms,
            "node": "node-1",
            "outcome": "{{outcome}}",
            "lateness_ms": -1,
            "at_ms": -2,
            "manual": False,
            "coalesced": None,
        }
    ).replace('"lateness_ms": -1', '"lateness_ms": {{lateness_ms}}')
    value = value.replace('"at_ms": -2', '"at_ms": {{at_ms}}')
    extra = {"logged": True} if LOGGED else {}
    kind = f"beatless/history/{address}"
    return Note(kind, request.id, value, 86_400_000, HISTORY_KEEP, **extra)


def cpu_s(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def steady(store: RedisStore, client: Any, size: int, rounds: int) -> dict[str, float]:
    """Scripts of ``size`` firings, each won, pushed and noted, as a steady node sends
    them; figures per firing over ``rounds`` scripts after the histories are full."""
    addresses = [f"bench/e{i:03d}" for i in range(ADDRESSES)]
    turn = 0

    def one_script() -> None:
        nonlocal turn
        now = int(time.time() * 1_000)  # the private server's host: one clock
        chosen = [addresses[(turn + i) % ADDRESSES] for i in range(size)]
        turn += size
        requests = [ClaimRequest(uuid.uuid4().hex, a, now, 60_000, 80_000, now) for a in chosen]
        pushes = [[["LPUSH", "bench-queue", MESSAGE]] for _ in requests]
        notes = [history_note(a, r) for a, r in zip(chosen, requests, strict=True)]
        store.claim_and_push(requests, pushes, node="node-1", notes=notes)

    for _ in range(-(-ADDRESSES * (HISTORY_KEEP + 10) // size)):
        one_script()
    client.delete("bench-queue")
    client.config_resetstat()
    cpu = cpu_s(client)
    for _ in range(rounds):
        one_script()
    cpu = cpu_s(client) - cpu
    stats = client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    usec = {k.removeprefix("cmdstat_"): int(v["usec"]) for k, v in stats.items()}
    calls.pop("config|resetstat", None)
    firings = rounds * size
    calls["info"] = rounds  # the script's own; not the benchmark's INFO cpu and commandstats
    client.delete("bench-queue")
    figures = {
        "commands_per_firing": sum(calls.values()) / firings,
        "script_us_per_firing": usec.get("evalsha", 0) / firings,
        "cpu_us_per_firing": 1e6 * cpu / firings,
    }
    figures.update(split(client, store, one_script, rounds, size))
    return figures


def split(
    client: Any, store: RedisStore, one_script: Any, rounds: int, size: int
) -> dict[str, float]:
    """As many scripts again, with every command in the slow log: the time of the claim
    script and of the notes script after it (``INFO commandstats`` counts both as
    ``EVALSHA``), per firing. The slow log adds its own cost to each: compare these two
    figures with each other, and with the same figures of another build."""
    room = rounds * (4 * size + 20)  # the scripts' own commands are logged too
    client.config_set("slowlog-max-len", room)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    for _ in range(rounds):
        one_script()
    client.config_set("slowlog-log-slower-than", 10_000)
    by_script: Counter[str] = Counter()
    for entry in client.slowlog_get(room):
        command = entry["command"].split()
        if command and command[0].upper() == b"EVALSHA":
            by_script[command[1].decode()] += int(entry["duration"])
    client.slowlog_reset()
    client.delete("bench-queue")
    firings = rounds * size
    claim = by_script.pop(store._claim.sha, 0)
    figures = {"logged_claim_script_us_per_firing": claim / firings}
    if by_script:
        figures["logged_notes_script_us_per_firing"] = sum(by_script.values()) / firings
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--size", type=int, action="append")
    parser.add_argument("--steady", type=int, action="append", help="firings per script")
    parser.add_argument("--rounds", type=int, default=400, help="scripts measured (steady)")
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
            if args.steady:
                print(f"history logged: {'yes' if LOGGED else 'no (notes kept in place)'}")
            for size in args.steady or []:
                figures = steady(store, client, size, args.rounds)
                shown = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
                print(f"steady, {size:>3} firings per script: {shown}")
            if args.steady:
                return
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
