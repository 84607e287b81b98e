"""How late an instant's firings reach a consumer: one store object sending N firings due
at one instant on the atomic path, against the same messages pushed with no claim.

    python bench/instant.py                          # instants of 20, 50 and 100 firings
    python bench/instant.py --sizes 100 --rounds 60 --json

Starts a private ``redis-server`` (no persistence) on a free port and a reader thread that
pops the queue as ``bench/celery_redis.py``'s does: ``BRPOP``, then ``RPOP`` of whatever
else is there and the server's ``TIME`` in one ``MULTI``, each message stamped with that
``TIME``. Each round releases an instant on the next tenth of a second and sends its
firings the way a node does when it readied them ahead (every command packed, then a
wait for the release, then one send):

- ``beatless``: :meth:`RedisStore.claim_and_push` of N fresh firings, each a 1.4 kB
  ``LPUSH`` and a history note of about 300 bytes in its address's log;
- ``lpush``: the N ``LPUSH`` commands alone, pipelined: no claim, no history;
- ``lpush-one``: one ``LPUSH`` of the N messages.

Per mode and size it prints the lateness of the messages (their stamp minus the
release: p50, p99, max over the rounds after the first five), and the medians over the
rounds of: when the sender woke after the release, when the reader's first pop was
stamped, and when the sender had the reply. The sender, the reader and Redis share the
machine's cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from claim_commands import MESSAGE, free_port, history_note

from beatless.stores.base import ClaimRequest
from beatless.stores.redis.store import RedisStore

WARM_UP = 5
"""Rounds not counted: the first fill the addresses' logs and load the scripts."""
QUEUE = "bench-instant"


class Reader:
    """Pops the queue and stamps each pop with the server's ``TIME`` (ms)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.popped: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = redis.Redis(port=self.port)
        while not self._stop.is_set():
            item = client.brpop([QUEUE], timeout=0.2)
            if item is None:
                continue
            pipe = client.pipeline(transaction=True)
            pipe.rpop(QUEUE, 100_000)
            pipe.time()
            rest, (seconds, micros) = pipe.execute()
            self.popped.append((1 + len(rest or []), seconds * 1_000 + micros / 1_000))
        client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def one_instant(store: RedisStore, client: Any, mode: str, size: int) -> tuple[int, float, float]:
    """Send one instant of ``size`` firings; the release (ms), when the sender woke after
    it and when it had the reply (ms after it)."""
    release = (int(time.time() * 1_000) // 100 + 3) * 100
    woke: list[float] = []

    def wait() -> None:
        left = release / 1_000 - time.time()
        if left > 0:
            time.sleep(left)
        woke.append(time.time() * 1_000 - release)

    if mode == "beatless":
        addresses = [f"bench/e{i:03d}" for i in range(size)]
        requests = [
            ClaimRequest(uuid.uuid4().hex, a, release, 60_000, 80_000, release) for a in addresses
        ]
        store.claim_and_push(
            requests,
            [[["LPUSH", QUEUE, MESSAGE]]] * size,
            node="node-1",
            notes=[history_note(a, r) for a, r in zip(addresses, requests, strict=True)],
            before_send=wait,
        )
    elif mode == "lpush":
        pipe = client.pipeline(transaction=False)
        for _ in range(size):
            pipe.lpush(QUEUE, MESSAGE)
        wait()
        pipe.execute()
    else:
        wait()
        client.lpush(QUEUE, *([MESSAGE] * size))
    return release, woke[0], time.time() * 1_000 - release


def measure(port: int, mode: str, size: int, rounds: int) -> dict[str, Any]:
    store = RedisStore(f"redis://127.0.0.1:{port}/0", namespace=f"instant-{uuid.uuid4().hex[:6]}")
    client = redis.Redis(port=port)
    reader = Reader(port)
    lateness: list[float] = []
    woke, first, replied = [], [], []
    popped = 0
    try:
        for round_ in range(rounds + WARM_UP):
            start = len(reader.popped)
            release, awake, reply = one_instant(store, client, mode, size)
            deadline = time.monotonic() + 5
            while sum(c for c, _ in reader.popped[start:]) < size and time.monotonic() < deadline:
                time.sleep(0.002)
            pops = reader.popped[start:]
            popped += sum(c for c, _ in pops)
            if round_ < WARM_UP or not pops:
                continue
            lateness += [at - release for count, at in pops for _ in range(count)]
            woke.append(awake)
            first.append(pops[0][1] - release)
            replied.append(reply)
    finally:
        reader.stop()
        store.close()
        client.close()
    lateness.sort()

    def q(p: float) -> float:
        return round(lateness[min(len(lateness) - 1, round(p * (len(lateness) - 1)))], 2)

    return {
        "mode": mode,
        "size": size,
        "messages": len(lateness),
        "popped": popped,
        "sent": size * (rounds + WARM_UP),
        "lateness_ms": {"p50": q(0.5), "p99": q(0.99), "max": round(lateness[-1], 2)},
        "woke_ms": round(statistics.median(woke), 2),
        "first_pop_ms": round(statistics.median(first), 2),
        "reply_ms": round(statistics.median(replied), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 50, 100])
    parser.add_argument("--rounds", type=int, default=40, help="instants counted per case")
    parser.add_argument(
        "--modes", nargs="+", default=["beatless", "lpush", "lpush-one"], help="what is sent"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    port = free_port()
    binary = shutil.which("redis-server") or "redis-server"
    results = []
    with tempfile.TemporaryDirectory() as directory:
        server = subprocess.Popen(
            [binary, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", directory],
            stdout=subprocess.DEVNULL,
        )
        try:
            probe = redis.Redis(port=port)
            for _ in range(100):
                try:
                    probe.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            probe.close()
            for size in args.sizes:
                for mode in args.modes:
                    result = measure(port, mode, size, args.rounds)
                    results.append(result)
                    if not args.json:
                        late = result["lateness_ms"]
                        print(
                            f"{mode:>9} {size:>4} firings: lateness p50 {late['p50']:.2f} "
                            f"p99 {late['p99']:.2f} max {late['max']:.2f} ms; medians: woke "
                            f"{result['woke_ms']:.2f}, first pop {result['first_pop_ms']:.2f}, "
                            f"reply {result['reply_ms']:.2f} ms"
                        )
        finally:
            server.terminate()
            server.wait(10)
    if args.json:
        print(json.dumps({"parameters": vars(args), "results": results}))


if __name__ == "__main__":
    main()
