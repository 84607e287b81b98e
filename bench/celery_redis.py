"""Stock ``celery beat`` against three beatless beats, on a private Redis server.

    python bench/celery_redis.py            # 100 entries every 1-5 s for 60 s, then 10,000 at once
    python bench/celery_redis.py --json     # the same figures as one JSON object

Starts its own ``redis-server`` on a free port (killed by pid at the end), so that
Redis's command statistics count the benchmark alone. Then, one after the other:

* **steady**: ``--entries`` entries, entry ``i`` every ``1 + i % 5`` seconds, for
  ``--seconds``: first one stock ``celery beat`` process (``PersistentScheduler``), then
  three ``celery beat -S beatless.celery:BeatScheduler`` processes (the beatless scheduler
  with no worker around it: the same process shape as stock beat, three times). Nobody
  consumes the tasks; the benchmark pops each message from the queue as it lands
  (``BRPOP``) and reads when it was due from its headers.
* **burst**: ``--burst`` entries all due at one instant, and the time from that
  instant until the last of their messages is in the queue. The instant is ``--lead``
  seconds after the beats are started: beats ready only after it (ten thousand entries
  take a while to load on a busy machine) are reported as such, not as a burst.

``--busy`` starts one more process that keeps a core busy for the whole run (killed by
pid at the end), to measure on a machine with other work on it; ``--parts`` runs only the
steady run or only the burst. The load average is printed beside the figures.

Also the module of the Celery app those processes run (``-A celery_redis:app``),
configured by the ``BENCH_*`` environment variables this script sets.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TASK = "bench.noop"
DUE_HEADER = "bench_due_ms"
BEATLESS_BEAT = "beatless.celery:BeatScheduler"
STOCK_BEAT = "celery_redis:StampingScheduler"
NO_PERSISTENCE = ("--save", "", "--appendonly", "no", "--dir")
SCRIPT_INNER = ("time", "info", "get", "set", "lpush", "hset", "hget", "pexpire", "xadd", "xtrim")
SCRIPT_INNER += ("zadd", "zcard", "zrange", "zrangebyscore", "zremrangebyscore", "zremrangebyrank")
SCRIPT_INNER += ("hdel", "expire", "pexpireat", "pttl", "exists", "del")
"""Commands the beatless scripts run inside, counted in the scripts' time."""
CLAIM_PATH = ("evalsha", "set", "lpush", "xadd", "get", "getdel", "hget")
"""The commands of a firing's claim, push and history note (the claim and notes scripts,
and the commands they run): what a firing costs on the atomic path. Every other command of
the nodes is their own upkeep (their sync: reads and refreshes of notes, the store's
settings), which is constant per node; each script's one ``TIME`` counts on the claim
path, the other ``TIME``s in the upkeep."""
IDLE_S = 10.0
"""How long the server's CPU is read with only the reader on it, before the first beat
starts: the floor every run pays, whatever sends (its housekeeping and the reader's
polls)."""
PINGERS = 40
"""How many clients send one ``PING`` a second each, spread over the second, to read what
a bare round trip a second costs the server (:meth:`Redis.round_trip_cpu_s`): the floor of
any client that syncs once a second, as each beatless node does."""
DRAIN_S = 2.0
"""How long the reader keeps popping after the steady window, for firings due at its end."""
READY = {"stock": "beat: Starting...", "beatless": "beatless node "}


# -- the Celery app of the benchmark's processes (read from BENCH_* at import) ------------


def schedule_of(kind: str, mode: str, entries: int, burst_at_ms: int) -> dict[str, Any]:
    """The ``beat_schedule`` of one run.

    Steady: entry ``i`` every ``1 + i % 5`` s. Burst, stock beat: an interval of 60 s whose
    last run was 60 s before the burst instant. Burst, beatless: an interval of exactly
    the burst instant's epoch milliseconds, whose first occurrence (intervals are anchored
    to the epoch) is that instant.
    """
    if mode == "steady":
        return {
            f"e{i:05d}": {"task": TASK, "schedule": float(1 + i % 5), "args": (i,)}
            for i in range(entries)
        }
    if kind == "stock":
        last = datetime.fromtimestamp(burst_at_ms / 1_000, UTC) - timedelta(seconds=60)
        spec: dict[str, Any] = {"schedule": timedelta(seconds=60), "last_run_at": last}
    else:
        spec = {"schedule": timedelta(milliseconds=burst_at_ms)}
    return {f"b{i:05d}": {"task": TASK, "args": (i,), **spec} for i in range(entries)}


def make_app() -> Any:
    from celery import Celery

    env = os.environ
    app = Celery("bench", set_as_current=False)
    app.conf.update(
        broker_url=env["BENCH_BROKER"],
        task_default_queue=env["BENCH_QUEUE"],
        timezone="UTC",
        beat_schedule=schedule_of(
            env["BENCH_KIND"],
            env["BENCH_MODE"],
            int(env["BENCH_ENTRIES"]),
            int(env.get("BENCH_BURST_AT_MS", "0")),
        ),
        beatless_namespace=env["BENCH_QUEUE"],
        beat_max_loop_interval=1,
    )
    return app


_made: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``app`` and ``StampingScheduler``, made on first use, so that the benchmark itself
    imports no Celery app."""
    if name not in ("app", "StampingScheduler"):
        raise AttributeError(name)
    if name not in _made:
        _made[name] = make_app() if name == "app" else _stamping_scheduler()
    return _made[name]


def _stamping_scheduler() -> type:
    from celery.beat import PersistentScheduler

    class StampingScheduler(PersistentScheduler):  # type: ignore[misc]
        """Stock beat, unchanged, but each message carries the instant its entry was due
        by beat's own reckoning (its last run + its interval), to measure lateness."""

        def apply_async(
            self, entry: Any, producer: Any = None, advance: bool = True, **kw: Any
        ) -> Any:
            schedule = entry.schedule
            due = schedule.maybe_make_aware(entry.last_run_at) + schedule.run_every
            entry = self.reserve(entry) if advance else entry
            # A copy carries the header: the entry itself stays as beat keeps it (beat
            # compares its entries' options at every tick and rebuilds its heap if they
            # changed).
            stamped = copy.copy(entry)
            headers = {**(entry.options.get("headers") or {})}
            headers[DUE_HEADER] = round(due.timestamp() * 1_000)
            stamped.options = {**entry.options, "headers": headers}
            return super().apply_async(stamped, producer, False, **kw)

    return StampingScheduler


# -- processes and the private Redis ----------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Redis:
    """A ``redis-server`` of the benchmark's own, with no persistence."""

    port: int
    process: subprocess.Popen[bytes]
    client: Any
    idle: float | None = None
    round_trip: float | None = None

    @classmethod
    def start(cls, workdir: Path) -> Redis:
        import redis

        server = shutil.which("redis-server")
        if server is None:
            raise SystemExit("redis-server is not on PATH; install Redis to run this benchmark")
        port = free_port()
        process = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", *NO_PERSISTENCE, str(workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    process.kill()
                    raise SystemExit("the private redis-server did not start") from None
                time.sleep(0.05)
        return cls(port, process, client)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def commandstats(self) -> dict[str, int]:
        stats = self.client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}

    def command_usec(self) -> dict[str, int]:
        """Microseconds each command took, by name (``INFO commandstats``); a script's
        time includes that of the commands it ran, which are also counted on their own."""
        stats = self.client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["usec"]) for k, v in stats.items()}

    def reads(self) -> int:
        """Read events the server processed so far (``INFO stats``
        ``total_reads_processed``): about one per round trip of a client."""
        return int(self.client.info("stats")["total_reads_processed"])

    def cpu_s(self) -> float:
        """User + system CPU of the server process so far (``INFO cpu``)."""
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def idle_cpu_s_per_s(self, seconds: float) -> float:
        """The server's CPU a second over ``seconds`` with nothing sent but the reader's
        polls, read once: on the server as it started, before any beat ran (read again
        later, it would count the expiry of the earlier runs' keys as idle)."""
        if self.idle is None:
            before = self.cpu_s()
            time.sleep(seconds)
            self.idle = (self.cpu_s() - before) / seconds
        return self.idle

    def floors(self) -> tuple[float, float]:
        """The server's idle CPU a second, and one bare round trip a second's, each read
        once, before any beat ran (:meth:`idle_cpu_s_per_s`, :meth:`round_trip_cpu_s`)."""
        return self.idle_cpu_s_per_s(IDLE_S), self.round_trip_cpu_s(PINGERS, IDLE_S)

    def round_trip_cpu_s(self, clients: int, seconds: float) -> float:
        """The server's CPU a second that one client costs by one round trip a second (a
        ``PING``), above the idle floor: ``clients`` clients, each on a connection of its
        own, spread over the second, for ``seconds``. Read once, on the fresh server, after
        the idle floor."""
        if self.round_trip is None:
            import redis

            idle = self.idle_cpu_s_per_s(IDLE_S)
            connections = [redis.Redis(port=self.port) for _ in range(clients)]
            for connection in connections:
                connection.ping()
            start = time.monotonic() + 0.1

            def ping(i: int, connection: Any) -> None:
                for second in range(int(seconds)):
                    delay = start + second + i / clients - time.monotonic()
                    time.sleep(max(0.0, delay))
                    connection.ping()

            threads = [
                threading.Thread(target=ping, args=(i, c), daemon=True)
                for i, c in enumerate(connections)
            ]
            before, began = self.cpu_s(), time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - began
            self.round_trip = ((self.cpu_s() - before) / elapsed - idle) / clients
            for connection in connections:
                connection.close()
        return self.round_trip


@dataclass
class Beat:
    """One ``celery beat`` process in a session of its own."""

    process: subprocess.Popen[bytes]
    log: Path
    ready: str

    def is_ready(self) -> bool:
        return self.ready in self.log.read_text(errors="replace")

    def cpu_s(self) -> float:
        import psutil

        try:
            times = psutil.Process(self.process.pid).cpu_times()
        except psutil.NoSuchProcess:
            return float("nan")
        return float(times.user + times.system)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)


def start_beats(kind: str, n: int, env: dict[str, str], workdir: Path) -> list[Beat]:
    beats = []
    for i in range(n):
        log = workdir / f"{env['BENCH_QUEUE']}-{i}.log"
        args = ["-S", STOCK_BEAT, "-s", str(workdir / f"{env['BENCH_QUEUE']}-schedule")]
        if kind == "beatless":
            args = ["-S", BEATLESS_BEAT]
        command = ["celery", "-A", "celery_redis:app", "beat", "-l", "INFO", "--pidfile="]
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", *command, *args],
                cwd=workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        beats.append(Beat(process, log, READY[kind]))
    return beats


def environment(
    redis: Redis, kind: str, mode: str, entries: int, burst_at_ms: int = 0, *, nodes: int = 1
) -> dict:
    # A queue and a namespace per run: a run of ten beats after one of three would
    # otherwise find the occurrences between the two missed (nobody ran then), and claim
    # their markers inside its window.
    queue = f"{kind}-{mode}-{nodes}"
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "BENCH_BROKER": redis.url,
        "BENCH_QUEUE": queue,
        "BENCH_KIND": kind,
        "BENCH_MODE": mode,
        "BENCH_ENTRIES": str(entries),
        "BENCH_BURST_AT_MS": str(burst_at_ms),
    }


@dataclass
class Busy:
    """A process that keeps one core busy, started and killed by pid."""

    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, on: bool) -> Busy:
        if not on:
            return cls()
        spin = "import time\nwhile True: time.perf_counter()"
        return cls(subprocess.Popen([sys.executable, "-c", spin], start_new_session=True))

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


def load() -> list[float]:
    """The load average over 1, 5 and 15 minutes."""
    return [round(x, 2) for x in os.getloadavg()]


class NotReady(RuntimeError):
    """A beat did not start in time."""


def wait_ready(beats: list[Beat], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not all(b.is_ready() for b in beats):
        if time.monotonic() > deadline or any(b.process.poll() is not None for b in beats):
            tail = "\n".join(b.log.read_text(errors="replace")[-2_000:] for b in beats)
            raise NotReady(f"beat did not start:\n{tail}")
        time.sleep(0.05)
    return time.time()


# -- the steady run ---------------------------------------------------------------------


@dataclass
class Reader:
    """Pops every message of one queue as it lands; notes when it was due and popped."""

    redis: Redis
    queue: str
    popped: list[tuple[list[Any], int]] = field(default_factory=list)
    """The messages of each pop, as they came, and when they were popped (ms)."""
    stamps: int = 0
    """How many ``TIME`` commands this reader sent (one per pop), so that the command
    counts can leave them out."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Reader:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def seen(self) -> list[tuple[int, int]]:
        """``(due or release ms, popped ms)`` per message."""
        return [
            (due_ms(json.loads(raw)["headers"]), at) for batch, at in self.popped for raw in batch
        ]

    def _run(self) -> None:
        import redis

        client = redis.Redis(port=self.redis.port)
        while not self._stop.is_set():
            item = client.brpop([self.queue], timeout=0.2)
            if item is None:
                continue
            # Everything already in the queue landed by now: popped in one transaction with
            # the server's clock (the same host's), and stamped with that instant, which
            # every message of the pop reached the queue before. A stamp taken once the
            # reply is read would add the time this reader takes to receive and parse a
            # batch (2.4 ms for 45 messages here), a cost of the bench, not of the sender,
            # and one that only batched senders pay.
            pipe = client.pipeline(transaction=True)
            pipe.rpop(self.queue, 100_000)
            pipe.time()
            rest, (seconds, micros) = pipe.execute()
            self.stamps += 1
            # Read once the run is over: decoding them here would delay the next pop.
            self.popped.append(([item[1], *(rest or [])], seconds * 1_000 + micros // 1_000))
        client.close()


def claim_path_calls(stats: dict[str, int]) -> int:
    """The calls of :data:`CLAIM_PATH` in ``stats``, with one ``TIME`` per script."""
    calls = sum(stats.get(name, 0) for name in CLAIM_PATH)
    return calls + min(stats.get("time", 0), stats.get("evalsha", 0))


def due_ms(headers: dict[str, Any]) -> int:
    """Stock beat: the instant beat's schedule made the entry due. beatless: the release
    (occurrence + offset)."""
    if DUE_HEADER in headers:
        return int(headers[DUE_HEADER])
    occurrence = datetime.fromisoformat(headers["beatless_occurrence"])
    return round(occurrence.timestamp() * 1_000) + int(headers["beatless_offset_ms"])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def steady(redis: Redis, kind: str, nodes: int, args: argparse.Namespace, workdir: Path) -> dict:
    env = environment(redis, kind, "steady", args.entries, nodes=nodes)
    reader = Reader(redis, env["BENCH_QUEUE"]).start()
    idle_s_per_s, round_trip_s = redis.floors()
    beats = start_beats(kind, nodes, env, workdir)
    try:
        wait_ready(beats, timeout=60)
        time.sleep(args.warmup)
        redis.client.config_resetstat()
        stamps = reader.stamps
        cpu0 = [b.cpu_s() for b in beats]
        reads0 = redis.reads()
        server0 = redis.cpu_s()
        start = time.time() * 1_000
        time.sleep(args.seconds)
        stats = redis.commandstats()
        usec = redis.command_usec()
        reads1 = redis.reads()
        stamps = reader.stamps - stamps
        server1 = redis.cpu_s()
        end = time.time() * 1_000
        cpu1 = [b.cpu_s() for b in beats]
        time.sleep(DRAIN_S)  # a firing due just before the end still lands
    finally:
        for beat in beats:
            beat.stop()
        reader.stop()
    # Firings *due* inside the window: a start-up catch-up (occurrences before the
    # window) is never counted as lateness, whenever it is sent.
    window = [(d, p) for d, p in reader.seen if start <= d <= end]
    lateness = [p - d for d, p in window]
    # The nodes' round trips: the server's read events, less the reader's (a BRPOP, and a
    # pipeline of MULTI, RPOP, TIME and EXEC per pop) and the benchmark's own four INFOs.
    trips = max(0, reads1 - reads0 - stats.get("brpop", 0) - stamps - 4)
    reader = ("brpop", "rpop", "info", "config|resetstat", "multi", "exec")
    # The reader's commands: its pops, and per pop a MULTI, an EXEC and a TIME. The rest
    # of the MULTIs and EXECs are the nodes' own (a refresh of their notes on Redis 7:
    # beatless/stores/redis/_refresh.py), counted on.
    multis = {name: stats.pop(name, 0) for name in ("multi", "exec")}
    own = sum(stats.pop(name, 0) for name in reader)
    for name, count in multis.items():
        stats[name] = max(0, count - stamps)
        own += min(stamps, count)
    # The reader's TIME, one per pop (the scripts' own run inside them, counted on).
    reader_time = 0
    if stats.get("time"):
        reader_time = round(usec.get("time", 0) * min(stamps, stats["time"]) / stats["time"])
        usec["time"] -= reader_time
        stats["time"] -= min(stamps, stats["time"])
        own += stamps
    stats = {name: count for name, count in stats.items() if count}
    calls = sum(stats.values())
    firings = max(len(window), 1)
    seconds = (end - start) / 1_000
    scripted = sum(usec.get(name, 0) for name in ("evalsha", "eval"))
    # Time of the commands clients sent, each script and each EXEC once: its inner
    # commands are counted in its time, and again under their own names, which are left
    # out (a direct TIME or INFO of a node is left out with them: a microsecond or so
    # each). The nodes' EXECs are the EXECs' time but the reader's RPOPs and TIMEs (the
    # bookkeeping of the reader's own MULTIs is left in, a microsecond or so each).
    inner = sum(usec.get(name, 0) for name in SCRIPT_INNER) if scripted else 0
    nodes_exec = max(0, usec.get("exec", 0) - usec.get("rpop", 0) - reader_time)
    sent = sum(t for name, t in usec.items() if name not in reader) - inner + nodes_exec
    usec["exec"] = nodes_exec
    usec = {name: t for name, t in usec.items() if name not in reader or name == "exec"}
    return {
        "nodes": nodes,
        "firings": len(window),
        "seconds": seconds,
        "lateness_ms": {
            "p50": percentile(lateness, 0.50),
            "p99": percentile(lateness, 0.99),
            "max": max(lateness, default=float("nan")),
        },
        "cpu_s_per_node": [b - a for a, b in zip(cpu0, cpu1, strict=True)],
        "redis_calls": calls,
        "redis_calls_per_firing": calls / firings,
        "redis_claim_path_calls_per_firing": claim_path_calls(stats) / firings,
        "redis_upkeep_calls_per_node_s": (calls - claim_path_calls(stats)) / nodes / seconds,
        "redis_cpu_us_per_firing": 1e6 * (server1 - server0) / firings,
        "redis_idle_cpu_ms_per_s": 1e3 * idle_s_per_s,
        "redis_cpu_ms_per_s_above_idle": 1e3 * ((server1 - server0) / seconds - idle_s_per_s),
        "redis_round_trip_a_second_us_per_s": 1e6 * round_trip_s,
        "redis_cpu_us_per_firing_above_idle": (
            1e6 * (server1 - server0 - idle_s_per_s * seconds) / firings
        ),
        "redis_round_trips_per_node_s": trips / nodes / seconds,
        "redis_command_us_per_firing": sent / firings,
        "redis_script_us_per_firing": scripted / firings,
        "redis_commands": dict(sorted(stats.items(), key=lambda kv: -kv[1])[:30]),
        "redis_usec": dict(sorted(usec.items(), key=lambda kv: -kv[1])[:30]),
        "reader_calls_excluded": own,
        "load": load(),
    }


def added_nodes(runs: list[dict]) -> None:
    """Each run after the first: the server's CPU a second above idle that each node past
    the first run's adds (the same schedule, so the same firings: what is left is the
    nodes' upkeep), as ``redis_upkeep_us_per_added_node_s``."""
    first = runs[0]
    for run in runs[1:]:
        added = run["nodes"] - first["nodes"]
        if added:
            more = run["redis_cpu_ms_per_s_above_idle"] - first["redis_cpu_ms_per_s_above_idle"]
            run["redis_upkeep_us_per_added_node_s"] = 1e3 * more / added


# -- the burst ---------------------------------------------------------------------------


def burst(redis: Redis, kind: str, nodes: int, args: argparse.Namespace, workdir: Path) -> dict:
    """``args.burst`` entries due at one instant ``args.lead`` seconds after the start."""
    at_ms = (int(time.time()) + args.lead) * 1_000
    env = environment(redis, kind, "burst", args.burst, at_ms, nodes=nodes)
    queue = env["BENCH_QUEUE"]
    beats = start_beats(kind, nodes, env, workdir)
    count, last = 0, None
    try:
        try:
            ready = wait_ready(beats, timeout=args.lead + args.burst_cap)
        except NotReady as exc:
            return burst_not_ready(kind, nodes, args, str(exc))
        deadline = at_ms / 1_000 + args.burst_cap
        while time.time() < deadline:
            count = int(redis.client.llen(queue))
            if count >= args.burst:
                last = time.time()
                break
            time.sleep(0.002)
    finally:
        for beat in beats:
            beat.stop()
    redis.client.delete(queue)
    return {
        "nodes": nodes,
        "entries": args.burst,
        "ready_before_due_s": at_ms / 1_000 - ready,
        "enqueued": count,
        "done": last is not None,
        "last_enqueued_after_s": None if last is None else last - at_ms / 1_000,
        "cap_s": args.burst_cap,
        "load": load(),
    }


def burst_not_ready(kind: str, nodes: int, args: argparse.Namespace, why: str) -> dict:
    """A burst not measured: its beats were not ready at the instant."""
    print(f"{kind}: {why[-500:]}", file=sys.stderr)
    return {
        "nodes": nodes,
        "entries": args.burst,
        "ready_before_due_s": None,
        "enqueued": 0,
        "done": False,
        "last_enqueued_after_s": None,
        "cap_s": args.burst_cap,
        "load": load(),
        "not_ready": f"not ready {args.lead + args.burst_cap:.0f} s after start (raise --lead)",
    }


# -- report ------------------------------------------------------------------------------


def rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    s, b = result.get("steady"), result.get("burst")
    p = result["parameters"]

    def lat(r: dict) -> str:
        m = r["lateness_ms"]
        return f"{m['p50']:.0f} / {m['p99']:.0f} / {m['max']:.0f} ms"

    def cpu(r: dict) -> str:
        per = r["cpu_s_per_node"]
        each = ", ".join(f"{c:.2f}" for c in per) if len(per) <= 3 else f"{sum(per):.2f} in all"
        return f"{each} s ({100 * sum(per) / len(per) / r['seconds']:.1f} % of a core each)"

    def us(r: dict, name: str, suffix: str = "_per_firing") -> str:
        return f"{r[name + suffix]:.0f} us"

    def done(r: dict) -> str:
        if r.get("not_ready"):
            return str(r["not_ready"])
        late = -r["ready_before_due_s"]
        if late > 0:  # its start-up caught the entries up: not a burst (raise --lead)
            return f"ready {late:.1f} s after the instant (raise --lead)"
        if r["done"]:
            return f"{r['last_enqueued_after_s']:.2f} s"
        text = f"not done after {r['cap_s']:.0f} s: {r['enqueued']:,} of {r['entries']:,}"
        if r["enqueued"]:
            text += f" (~{r['entries'] * r['cap_s'] / r['enqueued']:,.0f} s at that rate)"
        return text

    def added(r: dict) -> str:
        more = r.get("redis_upkeep_us_per_added_node_s")
        return "" if more is None else f"{more:.0f} us"

    def loads(r: dict) -> str:
        return " / ".join(f"{x:.1f}" for x in r["load"])

    nodes = p["nodes"] if isinstance(p["nodes"], list) else [p["nodes"]]
    pad = ("",) * (len(nodes) - 1)
    lines: list[tuple[str, ...]] = [
        ("", "stock celery beat (1)", *(f"beatless beat ({n})" for n in nodes))
    ]
    if p["busy"]:
        lines.append(("other work", "one process keeping a core busy", "the same", *pad))
    if s is not None:
        runs = [s["stock"], *s.get("beatless_runs", [s["beatless"]])]
        lines += [
            (
                "steady schedule",
                f"{p['entries']} entries, every 1-5 s, {p['seconds']:.0f} s",
                *("the same" for _ in runs[1:]),
            ),
            ("firings in window", *(f"{r['firings']:,}" for r in runs)),
            ("lateness p50 / p99 / max", *(lat(r) for r in runs)),
            ("CPU per node", *(cpu(r) for r in runs)),
            ("Redis calls per firing", *(f"{r['redis_calls_per_firing']:.2f}" for r in runs)),
            (
                "  on the claim path (claim, push, history)",
                *(f"{r['redis_claim_path_calls_per_firing']:.2f}" for r in runs),
            ),
            (
                "  each node's upkeep, a second",
                *(f"{r['redis_upkeep_calls_per_node_s']:.1f}" for r in runs),
            ),
            ("Redis command time per firing", *(us(r, "redis_command_us") for r in runs)),
            ("  of which in scripts", *(us(r, "redis_script_us") for r in runs)),
            ("Redis process CPU per firing", *(us(r, "redis_cpu_us") for r in runs)),
            (
                "  above the idle server's",
                *(us(r, "redis_cpu_us_per_firing_above_idle", "") for r in runs),
            ),
            (
                "  the idle server's, a second",
                *(f"{r['redis_idle_cpu_ms_per_s']:.2f} ms" for r in runs),
            ),
            (
                "  each node more than the first run's, a second",
                *(added(r) for r in runs),
            ),
            (
                "  one bare round trip a second, a client",
                *(us(r, "redis_round_trip_a_second_us", "_per_s") for r in runs),
            ),
            (
                "Redis round trips per node a second",
                *(f"{r.get('redis_round_trips_per_node_s', float('nan')):.1f}" for r in runs),
            ),
            ("steady: load 1 / 5 / 15 min", *(loads(r) for r in runs)),
        ]
    if b is not None:
        lines += [
            (
                "burst: entries due at once",
                f"{b['stock']['entries']:,}",
                f"{b['beatless']['entries']:,}",
                *pad,
            ),
            ("burst: last enqueued after", done(b["stock"]), done(b["beatless"]), *pad),
            ("burst: load 1 / 5 / 15 min", loads(b["stock"]), loads(b["beatless"]), *pad),
        ]
    return lines


def table(result: dict[str, Any]) -> str:
    lines = rows(result)
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in lines
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100, help="entries of the steady run")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the steady run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[3], help="beatless beat processes (runs)"
    )
    parser.add_argument("--burst", type=int, default=10_000, help="entries due at once")
    parser.add_argument("--no-burst", action="store_true", help="the steady runs only")
    parser.add_argument(
        "--lead",
        type=int,
        default=None,
        help="seconds from start to the burst (20, or 40 with --busy: three beats load "
        "10,000 entries in 20-25 s beside a busy core)",
    )
    parser.add_argument("--burst-cap", type=float, default=45.0, help="give up after this")
    parser.add_argument(
        "--parts", nargs="+", choices=["steady", "burst"], default=["steady", "burst"]
    )
    parser.add_argument(
        "--busy", action="store_true", help="keep one core busy with another process"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.lead is None:
        args.lead = 40 if args.busy else 20
    # A benchmark stopped with SIGTERM still stops its beats and its Redis.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    result: dict[str, Any] = {"parameters": vars(args) | {"redis": "private redis-server"}}
    with tempfile.TemporaryDirectory(prefix="beatless-bench-") as tmp:
        workdir = Path(tmp)
        redis = Redis.start(workdir)
        busy = Busy.start(args.busy)
        try:
            if "steady" in args.parts:
                stock = steady(redis, "stock", 1, args, workdir)
                runs = [steady(redis, "beatless", n, args, workdir) for n in args.nodes]
                added_nodes(runs)
                result["steady"] = {"stock": stock, "beatless": runs[0], "beatless_runs": runs}
            if "burst" in args.parts and not args.no_burst:
                result["burst"] = {
                    "stock": burst(redis, "stock", 1, args, workdir),
                    "beatless": burst(redis, "beatless", args.nodes[0], args, workdir),
                }
        finally:
            busy.stop()
            redis.stop()
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))


if __name__ == "__main__":
    main()
