"""What an operator reads: one line per log record, whatever the names hold; a summary per
minute; a WARNING, once in a while, when another app's task holds our addresses; never
the task's arguments."""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import Clock, run_nodes
from test_two_phase import monotonic_of

import beatless
from beatless import Entry, Every, Firing, Schedule, StoreUnavailable
from beatless.core._logtext import LIMIT, shown
from beatless.fleet._members import member_of, members_kind
from beatless.fleet._notes import nodes_kind
from beatless.node._tally import FOREIGN_WARN_EVERY_MS, SUMMARY_EVERY_MS
from beatless.node.dispatch import Dispatcher, Wake, decide_claimed
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import claim_request
from beatless.stores.base import Outcome
from beatless.stores.memory import MemoryStore

FORGED = "\n2026-12-01 00:00:00 CRITICAL forged"
"""What a name would add to a log if it were written as it is: a line of its own."""
NAME = f"nightly{FORGED}"
TENANT = f"acme\r{FORGED}\x1b[2K\u2028"
NODE = f"node-1{FORGED}"
NAMESPACE = f"ns{FORGED}"
TASK = f"tasks.t{FORGED}"
LINE_BREAKS = ("\n", "\r", "\x1b", "\u2028", "\x85", "\u202e")


# -- the helper ------------------------------------------------------------------------------


def test_a_name_is_shown_quoted_as_repr_writes_it() -> None:
    assert shown("reports.nightly") == "'reports.nightly'" == repr("reports.nightly")
    assert shown("worker@host:12", quoted=False) == "worker@host:12"
    assert shown(None) == "None"


@pytest.mark.parametrize("char", [*LINE_BREAKS, "\t", "\x00", "\x7f"])
def test_line_breaks_control_characters_and_escapes_are_written_as_backslash_escapes(
    char: str,
) -> None:
    for quoted in (True, False):
        text = shown(f"a{char}b", quoted=quoted)
        assert char not in text
        assert "\\" in text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_a_bare_value_escapes_each_character_as_repr_does_outside_quotes(text: str) -> None:
    """Whatever the text, its bare form is each character as ``repr`` writes it inside
    quotes (a printable one as itself, a backslash escaped), cut at the limit."""
    expected = "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in text[:50])
    cut = f"...({len(text) - 50} more characters)" if len(text) > 50 else ""
    assert shown(text, quoted=False, limit=50) == expected + cut


def test_a_long_name_is_cut_and_says_how_much_was_left_out() -> None:
    text = shown("x" * (LIMIT + 1_000))

    assert text.startswith("'" + "x" * LIMIT + "'")
    assert text.endswith("...(1000 more characters)")
    assert shown("\n" * (LIMIT + 5), quoted=False).endswith("...(5 more characters)")


def test_an_error_is_shown_by_its_text() -> None:
    assert shown(RuntimeError(f"broker said{FORGED}"), quoted=False) == (
        "broker said\\n2026-12-01 00:00:00 CRITICAL forged"
    )


# -- no name forges a line --------------------------------------------------------------------


class Scripted(Dispatcher):
    """A dispatcher that answers each firing with the next outcome of ``outcomes``."""

    def __init__(self, clock: Clock, outcomes: Sequence[Outcome]) -> None:
        self.store = MemoryStore(clock=clock)
        self.outcomes = list(outcomes)

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        for firing in firings:
            outcome = self.outcomes.pop(0) if self.outcomes else Outcome.LOST
            decide_claimed(wake, firing, outcome)


class Unavailable(Dispatcher):
    def __init__(self, clock: Clock) -> None:
        self.store = MemoryStore(clock=clock)

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        raise StoreUnavailable(f"redis store at 10.0.0.1{FORGED}")


def forged(task: str = TASK, **kw: object) -> Schedule:
    kw.setdefault("trigger", Every(1))
    tenants = kw.pop("tenants", [TENANT])
    entry = Entry(name=NAME, task=task, tenants=tenants, **kw)  # type: ignore[arg-type]
    return Schedule([entry], namespace=NAMESPACE)


def failing_tenants() -> list[str]:
    raise RuntimeError(f"tenant service down{FORGED}")


def slow_send(clock: Clock, ms: int) -> Callable[[Firing], None]:
    def send(firing: Firing) -> None:
        clock.ms += ms

    return send


def raising_send(firing: Firing) -> None:
    raise RuntimeError(f"broker refused{FORGED}")


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every record of ``beatless`` loggers, DEBUG up: ``logs.records``."""
    caplog.set_level(logging.DEBUG, logger="beatless")
    return caplog


def test_names_tenants_nodes_and_tasks_never_start_a_log_line_of_their_own(
    logs: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    shared = MemoryStore(clock=clock)
    nodes = [
        # Two nodes of one app, and a third app whose task holds the same addresses.
        Scheduler(forged(), store=shared, clock=clock, node=NODE),
        Scheduler(forged(), store=shared, clock=clock, node=f"{NODE}-b"),
        Scheduler(forged("other.task"), store=shared, clock=clock, node=f"{NODE}-c"),
        # Trouble of every kind, each on a store of its own.
        Scheduler(
            forged(max_late="5s"),
            store=MemoryStore(clock=clock),
            clock=clock,
            node=NODE,
            enqueue=raising_send,
        ),
        Scheduler(forged(), store=Unavailable(clock), clock=clock, node=NODE),
        Scheduler(
            forged(),
            store=Scripted(clock, [Outcome.CORRUPT, Outcome.EARLY, Outcome.FORGOTTEN]),
            clock=clock,
            node=NODE,
        ),
        Scheduler(
            forged(),
            store=Scripted(clock, [Outcome.LATE] * 3),
            clock=clock,
            node=NODE,
        ),
        Scheduler(forged(tenants=failing_tenants), store=shared, clock=clock, node=NODE),
    ]
    run_nodes(nodes, clock, 3)
    slow = Scheduler(
        forged(trigger=Every(60)),
        store=MemoryStore(clock=clock),
        clock=clock,
        node=NODE,
        enqueue=slow_send(clock, 31_000),
        monotonic=monotonic_of(clock),
    )
    run_nodes([*nodes, slow], clock, SUMMARY_EVERY_MS / 1_000)
    clock.ms += 120_000  # a frozen node: what was due is late now
    run_nodes(nodes[:1], clock, 3)
    nodes[0].start()
    nodes[0].stop(timeout=10)

    messages = [r.getMessage() for r in logs.records]
    for record, message in zip(logs.records, messages, strict=True):
        assert not any(c in message for c in LINE_BREAKS), message
        if record.exc_info is None:
            line = logging.Formatter("%(asctime)s %(levelname)s %(message)s").format(record)
            assert "\n" not in line
    told = "\n".join(messages)
    assert "CRITICAL forged" in told
    for said in (
        "outcome=won",  # decisions
        "outcome=lost",
        "enqueue ",  # the enqueue of a node with no broker
        f", last {SUMMARY_EVERY_MS // 1_000}s: ",  # the summary
        "is held by a claim of another task",
        "leave no time within max_late",
        "enqueue failed",
        "retried every",
        "cannot read",
        "refused by the store as early",
        "lost its memory",
        "refused by the store as late",
        "tenants callable failed",
        "over its 12.0s deadline",
        "ran out before commit",
        "were more than max_late behind the clock",
        "more than max_late behind this node's clock",
        "scheduling 1 entries",
        "stopped",
    ):
        assert said in told, said


def test_task_arguments_never_reach_a_log_line(logs: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    entry = Entry(
        name="e",
        task="tasks.t",
        trigger=Every(1),
        args=["SECRET-ARG"],
        kwargs={"password": "SECRET-KW"},
        options={"headers": {"token": "SECRET-OPT"}},
        tenants=["a", "b"],
    )
    nodes = [Scheduler(Schedule([entry]), store=store, clock=clock, node=f"n{i}") for i in range(2)]

    run_nodes(nodes, clock, SUMMARY_EVERY_MS / 1_000 + 2)

    assert any(r.levelno == logging.INFO and "enqueue" in r.getMessage() for r in logs.records)
    assert not [r for r in logs.records if "SECRET" in r.getMessage()]


# -- the summary -----------------------------------------------------------------------------


def summaries(logs: pytest.LogCaptureFixture, node: str) -> list[str]:
    return [
        r.getMessage()
        for r in logs.records
        if r.levelno == logging.INFO and r.getMessage().startswith(f"node {node}, last ")
    ]


def test_each_node_logs_one_summary_a_minute_with_its_counts(
    logs: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    nodes = [
        Scheduler(
            Schedule([Entry(name="e", task="t", trigger=Every(1))]),
            store=store,
            clock=clock,
            node=f"n{i}",
            enqueue=lambda f: None,
        )
        for i in range(2)
    ]

    run_nodes(nodes, clock, 2 * SUMMARY_EVERY_MS / 1_000 + 1, step=0.5)

    first, second = summaries(logs, "n0"), summaries(logs, "n1")
    assert len(first) == len(second) == 2
    won = [int(m) for m in re.findall(r"won (\d+)", " ".join(first))]
    lost = [int(m) for m in re.findall(r"lost (\d+)", " ".join(second))]
    assert sum(won) == sum(lost) > 100
    assert all(s.endswith("clock offset to the store +0ms") for s in first)
    assert [
        r for r in logs.records if r.levelno == logging.INFO and "outcome=lost" in r.getMessage()
    ] == []


def test_the_summary_counts_occurrences_skipped_after_a_freeze_as_late(
    logs: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    node = Scheduler(
        Schedule([Entry(name="e", task="t", trigger=Every(1), tenants=["a", "b"])]),
        store=MemoryStore(clock=clock),
        clock=clock,
        node="n",
        enqueue=lambda f: None,
    )
    node.tick()
    clock.ms += 10 * SUMMARY_EVERY_MS  # frozen for ten minutes

    run_nodes([node], clock, 2)

    (summary,) = summaries(logs, "n")
    late = int(re.findall(r"late (\d+)", summary)[0])
    assert late == node.stats["e"].late_node >= 2 * 540


# -- another task under the same address --------------------------------------------------------


class AtomicMemory(Dispatcher):
    """Claim and commit in one step, as the Redis claim-and-push path does."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.queue: list[str] = []

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        outcomes = self.store.claim([claim_request(f) for f in firings], node=wake.node, lease_ms=1)
        won = [f.id for f, o in zip(firings, outcomes, strict=True) if o.is_won]
        self.store.commit(won, node=wake.node)
        self.queue += won
        for firing, outcome in zip(firings, outcomes, strict=True):
            decide_claimed(wake, firing, outcome)


def app(task: str) -> Schedule:
    """An app with one entry named like the other app's, in the same (default) namespace."""
    return Schedule([Entry(name="cleanup", task=task, trigger=Every(1))])


@pytest.mark.parametrize("path", ["two-phase", "atomic"])
def test_a_firing_held_by_another_task_is_counted_lost_and_foreign_and_warned_once_per_entry(
    logs: pytest.LogCaptureFixture, path: str
) -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    sent: dict[str, list[str]] = {"a": [], "b": []}

    def node(name: str, task: str) -> Scheduler:
        if path == "atomic":
            return Scheduler(app(task), store=AtomicMemory(store), clock=clock, node=name)
        return Scheduler(
            app(task),
            store=store,
            clock=clock,
            node=name,
            enqueue=lambda f: sent[name].append(f.id),
        )

    first, second = node("a", "billing.cleanup"), node("b", "reports.cleanup")

    run_nodes([first, second], clock, FOREIGN_WARN_EVERY_MS / 1_000 + 5, step=1.0)

    stats = second.stats["cleanup"]
    assert stats.won == 0
    assert stats.foreign == stats.lost == first.stats["cleanup"].won > 600
    assert sent["b"] == []
    warnings = [r.getMessage() for r in logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    tag = second.schedule.entries[0].task_tag
    assert warnings[0] == (
        f"entry 'cleanup': address 'default/cleanup' is held by a claim of another task "
        f"(its task tag is not {tag}, the tag of 'reports.cleanup'): two apps share "
        f"namespace 'default' in this store and take each other's firings; give each its "
        f"own namespace (or, if a rollout renamed the task, run one schedule on every "
        f"node); 1 firing(s) lost to it on this node"
    )
    (count,) = re.findall(r"; (\d+) firing\(s\) lost to it on this node$", warnings[1])
    assert 600 <= int(count) <= stats.foreign
    assert "foreign " in " ".join(summaries(logs, "b"))


def test_nodes_of_one_app_are_never_foreign_to_each_other(
    logs: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    nodes = [
        Scheduler(
            app("billing.cleanup"), store=store, clock=clock, node=f"n{i}", enqueue=lambda f: None
        )
        for i in range(3)
    ]

    run_nodes(nodes, clock, 30)

    assert sum(n.stats["cleanup"].foreign for n in nodes) == 0
    assert not [r for r in logs.records if r.levelno >= logging.WARNING]


# -- names read from the store -------------------------------------------------------------


def test_a_registry_note_with_a_huge_or_forged_node_name_makes_one_short_drift_line(
    logs: pytest.LogCaptureFixture,
) -> None:
    """Registry notes written by hand into a live fleet's store (any client can): a node
    name as long as a note's schema allows (1,000 characters) and one with line breaks
    and ANSI escapes, each with another fingerprint and tzdata, are warned about as drift
    in lines of bounded length that hold no line break and no escape; a note of 4 MB is
    skipped in one short line."""
    pytest.importorskip("redis")
    import redis
    from stores import REDIS, _RedisTestStore

    clock = Clock()
    store = _RedisTestStore(
        f"redis://{REDIS[1]}:{REDIS[2]}/0", prefix=f"beatless-test:{uuid.uuid4().hex}:"
    )
    node = Scheduler(forged(), store=store, clock=clock, node="n0")
    try:
        record = node.board.node_record(clock.ms)
        # The registry, which status reads, and the member notes, which the nodes read.
        for kind, written in (
            (nodes_kind(NAMESPACE), json.loads(record.to_json())),
            (members_kind(NAMESPACE), json.loads(member_of(record, None).to_json())),
        ):  # the notes hash as the Redis store documents it
            hash_key = f"{store.prefix}notes:{hashlib.sha256(kind.encode()).hexdigest()}"
            huge = "n" * 1_000
            expires = 10**15
            with redis.Redis(host=REDIS[1], port=REDIS[2]) as client:
                named = ((huge, "f" * 1_000), ("m" * 2_000_000, "g" * 2_000_000))
                for name, fingerprint in (*named, (NODE + "\x1b[31m", FORGED)):
                    note = {**written, "node": name, "fingerprint": fingerprint, "tzdata": FORGED}
                    client.hset(hash_key, name, f"v=1|{expires}|{json.dumps(note)}")
        node.board.sync(clock.ms)
    finally:
        store.close()

    drift = [r.getMessage() for r in logs.records if "different" in r.getMessage()]
    assert len(drift) == 2, drift  # fingerprints, tzdata
    for message in drift:
        assert not any(c in message for c in LINE_BREAKS), message
        assert len(message) < 3_000, len(message)
        assert "...(800 more characters)" in message or "tzdata" in message
        assert "CRITICAL forged" in message  # escaped, not left out
    messages = [r.getMessage() for r in logs.records]
    assert all(len(m) < 3_000 for m in messages), max(map(len, messages))
    assert any("skipped" in m and "over the 16384 of a note" in m for m in messages)


NAME_WORDS = frozenset(
    {"node", "name", "address", "tenant", "namespace", "entry", "task", "host", "bucket"}
    | {"queue", "message_id", "path", "where", "prefix", "schema", "store"}
)
"""What a value that holds a name is called where it is logged (``firing.entry.name``,
``run.address``, ``self.node``): written through ``shown``, it cannot forge a line."""


def _logged_names(source: str) -> list[tuple[int, str]]:
    """The arguments of each ``logger.<level>(...)`` call in ``source`` that pass a name
    as it is, with their line."""
    levels = {"debug", "info", "warning", "error", "exception", "critical"}
    found = []
    for call in ast.walk(ast.parse(source)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        owner = call.func.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if call.func.attr not in levels or "logger" not in name:
            continue
        for arg in call.args[1:]:
            word = arg.id if isinstance(arg, ast.Name) else getattr(arg, "attr", None)
            if isinstance(arg, ast.Name | ast.Attribute) and str(word).lstrip("_") in NAME_WORDS:
                found.append((arg.lineno, ast.unparse(arg)))
    return found


def test_every_name_a_log_line_carries_goes_through_shown() -> None:
    package = Path(beatless.__file__).parent
    raw = [
        f"{path.relative_to(package.parent)}:{line}: {arg}"
        for path in sorted(package.rglob("*.py"))
        for line, arg in _logged_names(path.read_text())
    ]
    assert raw == [], "write these through beatless.core._logtext.shown:\n" + "\n".join(raw)
