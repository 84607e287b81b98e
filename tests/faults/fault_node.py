"""One scheduler node for the fault tests, configured by a JSON file.

Usage: python tests/faults/fault_node.py CONFIG.json

CONFIG keys:

``store``            claim store URL (``redis://`` direct, or through a test proxy)
``node``             the node's name
``clock_offset_s``   added to the real clock: the node's clock runs this far ahead
``send_delay_s``     each send takes this long (a slow broker)
``broker``           optional ``redis://`` URL: each send also pushes the message there,
                     and raises when that server is down (a broker that fails)
``lease_s``          the scheduler's lease
``schedule``         see :func:`build_schedule`; the same on every node
``until``            when to stop (real clock, epoch seconds); SIGTERM stops it earlier
``record``           file that receives one JSON line per send
``summary``          file that receives the node's stats and decisions when it stops
``django``           optional: the django-celery-beat bridge polls beside the scheduler
                     (:mod:`django_node`)

Each send appends one line to ``record`` with the firing id, address, occurrence,
release, ``max_late_ms``, the task and args sent, the node, and two REAL instants
(``time.time()``, never the offset clock): ``called`` when the scheduler handed the
firing over, ``sent`` when the send finished; a send the broker refused has ``error``
instead of ``sent``. The line is one ``write`` to a file opened ``O_APPEND``, so nodes
that share a file never interleave, and a node that is killed loses no line it wrote.
Each commit that returns appends ``{"node", "commit": [ids], "at"}`` (accepted or
refused alike): until then a sent firing's outcome is unknown to the store, the window
in which a fault may make another node send it too.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from beatless import Cron, Entry, Every, Firing, Schedule
from beatless.node import dispatch
from beatless.node.scheduler import Scheduler
from beatless.stores import open_store

REPORTED_OUTCOMES = frozenset(
    {
        "late",
        "late_node",
        "late_store",
        "early",
        "forgotten",
        "corrupt",
        "clock_skew",
        "missed",
        "stale_schedule",
    }
)
"""Final decisions not to send a firing, each counted and reported by the node
(``missed``: the store refused every claim of it, full or its settings refused). Any
other decision sent it (won, takeover), left it to another node (lost, held) or to a
later try (enqueue_failed, stale_claim, unavailable, ...): a miss it explains is none."""


def build_schedule(spec: dict[str, Any]) -> Schedule:
    """The schedule every node runs, from its JSON form.

    ``{"namespace": ..., "anchor_s": ..., "entries": [{"name", "every_s" | "cron",
    "jitter_s", "max_late_s", "tenants"}]}``: ``every_s`` intervals are anchored at
    ``anchor_s`` (so a test can place occurrences just after its nodes start), and
    ``tenants`` is a count of tenants named ``t00000``, ``t00001``, ...
    """
    anchor = datetime.fromtimestamp(spec.get("anchor_s", 0), UTC)
    entries = []
    for item in spec["entries"]:
        if "cron" in item:
            trigger: Cron | Every = Cron(item["cron"], "UTC")
        else:
            trigger = Every(item["every_s"], anchor=anchor)
        count = item.get("tenants")
        entries.append(
            Entry(
                name=item["name"],
                task=f"faults.{item['name']}",
                trigger=trigger,
                jitter=item.get("jitter_s", 0),
                max_late=item["max_late_s"],
                tenants=[f"t{i:05d}" for i in range(count)] if count else None,
            )
        )
    return Schedule(entries, namespace=spec["namespace"])


def open_broker(url: str | None) -> Callable[[str], None] | None:
    """A push to a list in the Redis at ``url`` that raises when that server is down.

    No retries and short timeouts: a failed push is an enqueue that failed.
    """
    if url is None:
        return None
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis.from_url(
        url, socket_timeout=2, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )

    def push(message: str) -> None:
        client.rpush("faults:queue", message)

    return push


_LAST_READ = threading.local()


def noted_monotonic() -> float:
    """The monotonic clock, noting in this thread the real time of the read: the
    dispatcher's check of a claim's age is its last read before a send."""
    value = time.monotonic()
    _LAST_READ.at = time.time()
    return value


class CheckedAt(logging.Filter):
    """When the dispatcher last checked each firing before sending it (its ``SENDING``
    line at DEBUG, kept here and not logged): a send is in flight from that moment, since
    a freeze after it, even before the enqueue is called, is the residual window.

    The check is the claim's age, read on the dispatcher's monotonic clock: with
    :func:`noted_monotonic` as that clock, the check is its last read in the thread, even
    if the node froze between the check and the line; otherwise, the line's own time."""

    def __init__(self) -> None:
        super().__init__()
        self.times: dict[str, float] = {}
        self.floor = logging.NOTSET

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg is dispatch.SENDING and isinstance(record.args, tuple):
            read = getattr(_LAST_READ, "at", record.created)
            self.times[str(record.args[0])] = min(read, record.created)
            return False
        return record.levelno >= self.floor

    def install(self) -> None:
        """Let the dispatcher's DEBUG lines through to this filter only: the node logs
        at the level it was configured with."""
        log = logging.getLogger(dispatch.__name__)
        self.floor = log.getEffectiveLevel()
        log.addFilter(self)
        log.setLevel(logging.DEBUG)

    def pop(self, firing_id: str) -> float | None:
        return self.times.pop(firing_id, None)


def record_commits(store: Any, node: str, record_fd: int) -> None:
    """Make ``store.commit`` append one line to the record when it returns: the ids it was
    given and when (real clock). A commit that raises writes nothing (its outcome is
    unknown)."""
    commit = store.commit

    def recording(ids: Any, **kwargs: Any) -> Any:
        kept = commit(ids, **kwargs)
        line = {"node": node, "commit": list(ids), "at": time.time()}
        os.write(record_fd, (json.dumps(line) + "\n").encode())
        return kept

    store.commit = recording


def make_enqueue(config: dict[str, Any], record_fd: int) -> Callable[[Firing], None]:
    """The enqueue of a node: wait the send delay, push to the broker, record the send
    (``called``: when the dispatcher checked the firing last, before it called this)."""
    delay = float(config.get("send_delay_s", 0))
    push = open_broker(config.get("broker"))
    node = config["node"]
    checked = CheckedAt()
    checked.install()

    def enqueue(firing: Firing) -> None:
        called = checked.pop(firing.id) or time.time()
        if delay:
            time.sleep(delay)
        line = {
            "id": firing.id,
            "address": firing.address,
            "entry": firing.entry.name,
            "occurrence_ms": firing.occurrence_ms,
            "release_ms": firing.release_ms,
            "max_late_ms": firing.entry.max_late_ms,
            "task": firing.entry.task,
            "args": list(firing.entry.args),
            "node": node,
            "called": called,
        }
        try:
            if push is not None:
                push(json.dumps(line))
        except Exception as exc:
            line["error"] = f"{type(exc).__name__}: {exc}"
            raise
        else:
            line["sent"] = time.time()
        finally:
            os.write(record_fd, (json.dumps(line) + "\n").encode())

    return enqueue


class DecisionLog:
    """Counts every decision of the node, and keeps the ids it reported as not sent."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.by_entry: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.reported: defaultdict[str, list[str]] = defaultdict(list)
        self._lock = threading.Lock()

    def __call__(self, decision: Any) -> None:
        outcome = str(decision.outcome)
        with self._lock:
            self.outcomes[outcome] += 1
            self.by_entry[decision.firing.entry.name][outcome] += 1
            if outcome in REPORTED_OUTCOMES:
                self.reported[outcome].append(decision.firing.id)

    def snapshot(self) -> dict[str, Any]:
        """Counts (in all and per entry) and reported ids so far, copied while the loop
        may still decide."""
        with self._lock:
            return {
                "outcomes": dict(self.outcomes),
                "outcomes_by_entry": {k: dict(v) for k, v in self.by_entry.items()},
                "reported": {k: list(v) for k, v in self.reported.items()},
            }


def make_scheduler(
    config: dict[str, Any], schedule: Schedule, store: Any, decisions: DecisionLog, record_fd: int
) -> Scheduler:
    """The node's scheduler, with its clock offset, lease and recording enqueue."""
    offset = float(config.get("clock_offset_s", 0))
    options: dict[str, Any] = {
        "store": store,
        "enqueue": make_enqueue(config, record_fd),
        "clock": lambda: time.time() + offset,
        "node": config["node"],
        "lease": config.get("lease_s", 30),
    }
    parameters = inspect.signature(Scheduler).parameters
    if "on_decision" in parameters:
        options["on_decision"] = decisions
    if "monotonic" in parameters:
        options["monotonic"] = noted_monotonic
    return Scheduler(schedule, **options)


def write_summary(
    path: str,
    config: dict[str, Any],
    scheduler: Scheduler,
    decisions: DecisionLog,
    *,
    started: float,
    scheduling: float,
) -> None:
    """The node's stats per entry and its decisions, as JSON, for the test's report
    (``started``: when the process began its work; ``scheduling``: when its scheduler's
    start returned, after which no occurrence is a start-up catch-up)."""
    stats = getattr(scheduler, "stats", {}) or {}
    summary = {
        "node": config["node"],
        "clock_offset_s": config.get("clock_offset_s", 0),
        "started": started,
        "scheduling": scheduling,
        "stopped": time.time(),
        "stats": {name: _as_dict(value) for name, value in list(stats.items())},
        **decisions.snapshot(),
    }
    Path(path).write_text(json.dumps(summary))


def _as_dict(value: Any, attempts: int = 5) -> Any:
    """``value.as_dict()``, tried again if the loop, still busy in a send, changes it
    while it is read."""
    as_dict = getattr(value, "as_dict", None)
    if not callable(as_dict):
        return repr(value)
    for _ in range(attempts - 1):
        try:
            return as_dict()
        except RuntimeError:  # a deque or dict mutated during iteration
            time.sleep(0.01)
    return as_dict()


def main(argv: list[str]) -> None:
    config = json.loads(Path(argv[1]).read_text())
    logging.basicConfig(
        level=config.get("log_level", "WARNING"),
        format=f"%(asctime)s {config['node']} %(levelname)s %(name)s: %(message)s",
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    started = time.time()
    schedule = build_schedule(config["schedule"])
    store = open_store(config["store"], namespace=schedule.namespace)
    record_fd = os.open(config["record"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    record_commits(store, config["node"], record_fd)
    decisions = DecisionLog()
    scheduler = make_scheduler(config, schedule, store, decisions, record_fd)
    scheduler.start()
    scheduling = time.time()
    duty = None
    try:
        if "django" in config:
            import django_node

            duty = django_node.start(config, scheduler, store)
        stopping.wait(max(float(config["until"]) - time.time(), 0))
    finally:
        if duty is not None:
            duty.stop(timeout=5)
        scheduler.stop(timeout=5)
        write_summary(
            config["summary"],
            config,
            scheduler,
            decisions,
            started=started,
            scheduling=scheduling,
        )
    # A loop still busy in a long send is a daemon thread: leave without waiting for it
    # (the record file stays open for it until then; every line it wrote is complete).
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
