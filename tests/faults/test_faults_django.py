"""django-celery-beat rows under faults: rows edited through the ORM while the nodes that
poll them are killed, frozen and cut off from the Django database.

Three ``fault_node`` processes on a private Redis (the claim store) run a code entry and
the django-celery-beat bridge (:mod:`django_node`): each second one of them, chosen by
the store, polls the rows of the tests' Django project on PostgreSQL (a schema of the
session's own), which the nodes reach through a TCP proxy, and publishes what changed as a
live revision owned by ``django``. Each read of rows takes 0.3 s longer (a slow
database), so that a fault that falls in a poll falls between its read and its publish.
This process edits the rows through the ORM, as the admin and application code do, at
random instants for 40 s: args and interval changed by ``save()``, a row disabled or
enabled again, created, deleted, several saved in one transaction, args changed by
``queryset.update()`` (no signal, no ``date_changed``: only the full pass, every 5 s
here, sees it), and clocked one-offs a few seconds ahead. Each edit writes its number in
the row's args. Meanwhile, in seconds from the start of the edits:

* 5 s: the node caught in a poll (the duty holder of that second) is killed (SIGKILL);
  3 s later a new node, n3, starts in its place;
* 13 s: the node caught in a poll is frozen (SIGSTOP) for 8 s (max_late), then thawed;
* 24 s: the nodes' link to the Django database is cut for 6 s (connections reset, new
  ones refused);
* 33 s: the link holds every byte for 4 s, then delivers them late: the polls hang.

Then, from the sends the nodes recorded and the revisions in the store, with the helpers
of the live fault test (``live_edits``, :mod:`analysis`):

* no firing is sent twice, but one whose first copy was in flight when the kill or the
  freeze struck the node sending it (the two-phase window; the freeze is aimed at a
  poll, but stops the whole node, its sends too), told by that node if it lived;
* every send of a row ran under the revision in force at its occurrence: an occurrence of
  that definition's trigger, its task and args, the entry enabled;
* every firing expected (the code entry's, and each occurrence of the definitions in
  force) is sent, but those a fault excuses; the nodes claim every firing and a pending
  claim's lease is 3 s, so none should need it. No send is stale or early;
* every edit is in force (a revision shows it, or a later edit of its row) within
  :data:`IN_FORCE_S` of its commit, or of the end of the database's outage it fell in; a
  ``queryset.update()`` within the full pass's period more;
* no revision sets a row back to a definition older than one published before it.

Run with ``python -m pytest tests/faults/test_faults_django.py -m faults -s``; a failure
names its seed, and ``BEATLESS_SEED=n`` runs its edits again (the faults fall by the
clock, so a run is not repeated exactly).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django_project import chosen
from harness import Fleet, drawn_seed, next_whole_second, sleep_until
from proxy import Proxy
from redis_server import RedisServer
from test_faults_live import NAMESPACE, judge

from beatless.live import Live
from beatless.live.codec import entry_from_json
from beatless.live.revisions import Revision, fold
from beatless.stores import open_store

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FleetFactory = Callable[[dict[str, Any]], Fleet]
ProxyFactory = Callable[[tuple[str, int]], Proxy]

TESTS = Path(__file__).resolve().parents[1]
POSTGRES = ("127.0.0.1", 5432)
NAMES = ("a", "b", "c", "d", "e")
MAX_LATE_S = 8
HASH_EVERY_S = 5
READ_DELAY_S = 0.3
READY_S = 60.0
"""The nodes must have set Django up and published the first rows by then (it took 16 s
on a loaded 2-core machine); the edits begin 2 s after."""
EDITING_S = 40
GRACE_S = 4
KILL_AT_S, RESTART_AFTER_S = 5, 3
FREEZE_AT_S, FROZEN_S = 13, 8
CUT_AT_S, CUT_S = 24, 6
HOLD_AT_S, HELD_S = 33, 4
IN_FORCE_S = 8.0
"""An edit is in force within: a poll (each second, the second-ranked node 0.4 s after
the first), the slow read (0.3 s), the fence (2 s after the commit), and 5 s for seconds
whose two first-ranked nodes are the killed and the frozen one (none polls them), a poll
that lost to another node's revision, and a loaded machine."""


@dataclass(frozen=True)
class Edit:
    """One edit of one row: its number (in the row's args), the row, how, and when its
    transaction had committed (real clock)."""

    number: int
    name: str
    kind: str
    at: float

    @property
    def deletes(self) -> bool:
        return self.kind == "delete"


class Editor:
    """Edits django-celery-beat's rows through the ORM, at random; keeps every edit."""

    def __init__(self, rng: random.Random) -> None:
        from django_celery_beat.models import IntervalSchedule

        self.rng = rng
        self.every = {
            s: IntervalSchedule.objects.create(every=s, period=IntervalSchedule.SECONDS)
            for s in (1, 2, 3)
        }
        self.present: set[str] = set()
        self.done: list[Edit] = []
        self.number = 0

    def edit(self) -> None:
        """One random edit (see the module docstring)."""
        self.number += 1
        roll, number, present = self.rng.random(), self.number, sorted(self.present)
        if roll < 0.1:
            self._clocked(number)
        elif roll < 0.25 and len(present) > 1:
            self._delete(number, self.rng.choice(present))
        elif roll < 0.4 and present:
            self._update(number, self.rng.choice(present))
        elif roll < 0.5 and present:
            name = self.rng.choice(present)
            self._done(number, [(name, self._save(number, name, toggle=True))])
        elif roll < 0.6:
            self._batch(number, self.rng.sample(NAMES, self.rng.randint(2, 3)))
        else:
            name = self.rng.choice(NAMES)
            self._done(number, [(name, self._save(number, name))])

    def _save(self, number: int, name: str, *, toggle: bool = False) -> str:
        """Save row ``name`` with new args and interval (created if absent, enabled or
        disabled again with ``toggle``); how."""
        from django_celery_beat.models import PeriodicTask

        task = PeriodicTask.objects.filter(name=name).first()
        kind = "toggle" if toggle else "save"
        if task is None:
            task, kind = PeriodicTask(name=name, task=f"faults.dj.{name}"), "create"
        elif toggle:
            task.enabled = not task.enabled
        task.args = json.dumps([number, name])
        task.interval = self.every[self.rng.choice((1, 2, 3))]
        task.save()
        return kind

    def _batch(self, number: int, names: list[str]) -> None:
        from django.db import transaction

        with transaction.atomic():
            kinds = [(name, self._save(number, name)) for name in names]
        self._done(number, [(name, f"batch {kind}") for name, kind in kinds])

    def _update(self, number: int, name: str) -> None:
        from django_celery_beat.models import PeriodicTask

        PeriodicTask.objects.filter(name=name).update(args=json.dumps([number, name]))
        self._done(number, [(name, "update")])

    def _delete(self, number: int, name: str) -> None:
        from django_celery_beat.models import PeriodicTask

        PeriodicTask.objects.filter(name=name).delete()
        self._done(number, [(name, "delete")])

    def _clocked(self, number: int) -> None:
        from django_celery_beat.models import ClockedSchedule, PeriodicTask

        name = f"once-{number}"
        soon = datetime.now(UTC) + timedelta(seconds=self.rng.uniform(4, 8))
        clocked = ClockedSchedule.objects.create(clocked_time=soon.replace(microsecond=0))
        PeriodicTask.objects.create(
            name=name,
            task="faults.dj.once",
            clocked=clocked,
            one_off=True,
            args=json.dumps([number, name]),
        )
        self._done(number, [(name, "clocked")])

    def _done(self, number: int, kinds: list[tuple[str, str]]) -> None:
        """Keep the edit of each row, once its transaction has committed."""
        at = time.time()
        for name, kind in kinds:
            self.done.append(Edit(number, name, kind, at))
            if kind == "delete":
                self.present.discard(name)
            elif name in NAMES:
                self.present.add(name)


@dataclass
class Outage:
    """When no node could read the Django database (real clock, seconds): before the first
    poll, and while the link to it was cut or held."""

    first_poll: float
    spans: list[tuple[float, float]]

    def reachable_after(self, instant: float) -> tuple[float, str]:
        """When the database was readable for an edit committed at ``instant``: then
        (``"save"``), or at the first poll (``"before the first poll"``), or at the end
        of the outage it fell in (``"in an outage"``; one just before it counts, its poll
        may have begun)."""
        if instant < self.first_poll:
            return self.first_poll, "before the first poll"
        for start, end in self.spans:
            if start - 1.5 <= instant <= end:
                return end, "in an outage"
        return instant, "save"


@pytest.fixture
def rows(django_project: dict[str, str]) -> Iterator[dict[str, str]]:
    """The Django project's environment, its PostgreSQL tables emptied, this process's
    ORM on them (direct, not through the test's proxy)."""
    with chosen("postgres"):
        yield django_project


def test_rows_edited_through_the_orm_under_kill_freeze_and_a_lost_database_run_as_in_force(
    rows: dict[str, str],
    redis_server: Callable[..., RedisServer],
    proxy: ProxyFactory,
    fleet: FleetFactory,
) -> None:
    """Faults: the polling node killed, a polling node frozen for 8 s, the Django database
    cut off for 6 s, then held for 4 s, while rows are edited through the ORM. 0 firings
    sent twice; every send of a row is the definition in force at its occurrence; every
    expected firing sent but those a fault excuses; every edit in force within 7 s (after
    the database is back; a ``queryset.update()`` 5 s more); no row ever set back."""
    seed = drawn_seed()
    rng = random.Random(seed)
    store = redis_server("store")
    link = proxy(POSTGRES)
    editor = Editor(rng)
    for _ in range(3):
        editor.edit()
    run = fleet(
        {
            "namespace": NAMESPACE,
            "anchor_s": next_whole_second(0),
            "entries": [{"name": "tick", "every_s": 1, "max_late_s": MAX_LATE_S}],
        }
    )
    until = time.time() + READY_S + 2 + EDITING_S + 4 + MAX_LATE_S + GRACE_S
    common = {"store": store.url, "send_delay_s": 0.005, "lease_s": 3, "until": until}

    def node(name: str) -> dict[str, Any]:
        env = {**rows, "BEATLESS_DJANGO_DB": "postgres", "BEATLESS_DJANGO_PG_PORT": str(link.port)}
        django = {
            "env": env,
            "path": str(TESTS),
            "database": "postgres",
            "hash_every_s": HASH_EVERY_S,
            "max_late_s": MAX_LATE_S,
            "read_delay_s": READ_DELAY_S,
            "polls": str(run.workdir / f"{name}.polls.jsonl"),
        }
        return {"node": name, "django": django}

    run.start(common, [node(f"n{i}") for i in range(3)])
    wait_ready(run, READY_S)
    anchor = next_whole_second(2)
    faults = Faults(run, link, anchor, lambda: run.start(common, [node("n3")]))
    faults.start()
    sleep_until(anchor)
    while time.time() < anchor + EDITING_S:
        editor.edit()
        time.sleep(rng.uniform(0.1, 1.2))
    faults.finish()
    run.wait(timeout=anchor + EDITING_S + 4 + MAX_LATE_S + GRACE_S - time.time())  # then stop

    reader = open_store(store.url, namespace=NAMESPACE)
    revisions = Live(reader, namespace=NAMESPACE).revisions()
    reader.close()
    judged = judge(run, revisions, (anchor, anchor + EDITING_S + 4))
    report = judged.report
    polls = read_polls(run)
    first_poll = min(
        p["begin"] for name in run.names for p in _poll_lines(run, name) if "begin" in p
    )
    backwards = set_back(revisions, editor.done)
    late, lags = in_force(revisions, editor.done, Outage(first_poll, faults.outages))
    print(
        f"django seed {seed}: {len(editor.done)} row edits "
        f"({dict(Counter(e.kind for e in editor.done))}), {len(revisions)} revisions, "
        f"{judged.sends} sends ({sum(judged.live_sends.values())} of rows), "
        f"{len(judged.twice)} sent twice, {len(judged.wrong)} not as in force, "
        f"{report.misses} of {report.expected} expected missed "
        f"({report.excused_misses} excused by a fault), {len(backwards)} rows set back, "
        f"{len(late)} edits in force late; edit to in force: {lags}; polls "
        f"{dict(Counter(p['how'] for p in polls))}; faults {faults.said}"
    )
    judged.assert_as_in_force(seed, enough=40, killed=faults.killed)
    assert not backwards, f"seed {seed}: " + "; ".join(backwards[:5])
    assert not late, f"seed {seed}: " + "; ".join(late[:5])


class Faults(threading.Thread):
    """The faults of the module docstring, at their times from ``anchor``, in a thread of
    their own while the test edits the rows: ``restart()`` starts the new node."""

    def __init__(
        self, fleet: Fleet, link: Proxy, anchor: float, restart: Callable[[], None]
    ) -> None:
        super().__init__(name="faults", daemon=True)
        self.fleet = fleet
        self.link = link
        self.anchor = anchor
        self.restart = restart
        self.killed: list[str] = []
        self.outages: list[tuple[float, float]] = []
        self.said: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._faults()
        except BaseException as exc:  # raised again by finish(), in the test's thread
            self.error = exc

    def finish(self) -> None:
        """Wait for the faults to end; raise what failed in them."""
        self.join(EDITING_S + 30)
        if self.error is not None:
            raise self.error
        assert not self.is_alive(), "the faults did not end"

    def _faults(self) -> None:
        alive = {"n0", "n1", "n2"}
        sleep_until(self.anchor + KILL_AT_S)
        victim, caught = polling(self.fleet, alive)
        os.kill(self.fleet.pid(victim), signal.SIGKILL)
        killed = time.time()  # after the signal: a send begun before it is in flight at it
        self.fleet.fault(f"{victim} killed", killed, killed, nodes=[victim])
        self.killed.append(victim)
        alive.discard(victim)
        self.said.append(f"{victim} killed{' in a poll' if caught else ''}")
        time.sleep(RESTART_AFTER_S)
        self.restart()
        alive.add("n3")

        sleep_until(self.anchor + FREEZE_AT_S)
        victim, caught = polling(self.fleet, alive)
        self.fleet.freeze(victim)
        frozen = time.time()
        time.sleep(FROZEN_S)
        self.fleet.thaw(victim)
        self.fleet.fault(f"{victim} frozen", frozen, time.time(), nodes=[victim])
        self.said.append(f"{victim} frozen{' in a poll' if caught else ''}")

        for at_s, span_s, how in ((CUT_AT_S, CUT_S, "cut"), (HOLD_AT_S, HELD_S, "held")):
            sleep_until(self.anchor + at_s)
            began = time.time()
            if how == "cut":
                self.link.drop()
            else:
                self.link.pause()
            time.sleep(span_s)
            self.link.resume()
            self.outages.append((began, time.time()))
            self.said.append(f"database {how} {time.time() - began:.1f}s")


def wait_ready(run: Fleet, timeout: float) -> None:
    """Wait until every node's poll duty runs and a poll has published the first rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [p for name in run.names for p in _poll_lines(run, name)]
        ready = {p["node"] for p in lines if "ready" in p}
        if ready == set(run.names) and any(p.get("revision") for p in lines):
            return
        time.sleep(0.2)
    pytest.fail(f"the nodes were not ready within {timeout:.0f}s: see {run.workdir}")


def polling(run: Fleet, alive: set[str], timeout: float = 4.0) -> tuple[str, bool]:
    """The node of ``alive`` in a poll that has read rows (begun 50 ms ago, not ended), and
    ``True``; if none within ``timeout``, the last to begin a poll, and ``False``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in sorted(alive):
            last = _last_poll(run, name)
            if last is not None and "begin" in last and time.time() - last["begin"] > 0.05:
                return name, True
        time.sleep(0.01)
    begun = {n: p["begin"] for n in alive if (p := _last_begun(run, n)) is not None}
    return max(begun, key=begun.__getitem__), False


def _poll_lines(run: Fleet, name: str) -> list[dict[str, Any]]:
    path = run.workdir / f"{name}.polls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def _last_poll(run: Fleet, name: str) -> dict[str, Any] | None:
    lines = _poll_lines(run, name)
    return lines[-1] if lines else None


def _last_begun(run: Fleet, name: str) -> dict[str, Any] | None:
    return next((p for p in reversed(_poll_lines(run, name)) if "begin" in p), None)


def read_polls(run: Fleet) -> list[dict[str, Any]]:
    """Every poll that ended, of every node: ``how`` it ended (wrote a revision, found
    nothing to write, lost to a newer revision, failed)."""
    ended = []
    for name in dict.fromkeys(run.names):
        for line in _poll_lines(run, name):
            if "failed" in line:
                ended.append({**line, "how": "failed"})
            elif "end" in line:
                how = "stale" if line["stale"] else "wrote" if line["revision"] else "nothing"
                ended.append({**line, "how": how})
    return ended


def _number(data: Any) -> int:
    """The number of the edit a row's published definition came from (in its args)."""
    return int(entry_from_json(dict(data)).args[0])


def _states(revisions: list[Revision]) -> Iterator[tuple[Revision, dict[str, Any]]]:
    """Each revision, in order, with the live entries after it."""
    current: dict[str, Any] = {}
    for revision in sorted(revisions, key=lambda r: r.number):
        current = fold(current, revision.changes)
        yield revision, current


def _number_at(name: str, data: Any, at: float, done: list[Edit]) -> int:
    """The edit a revision committed at ``at`` shows for row ``name``: the number in its
    args, or for a row it deletes, the last delete of that row committed before."""
    if data is not None:
        return _number(data)
    deletes = [e.number for e in done if e.name == name and e.deletes and e.at <= at]
    return max(deletes, default=0)


def set_back(revisions: list[Revision], done: list[Edit]) -> list[str]:
    """Revisions that set a row back to an edit older than one a revision before showed
    (a poll that published rows it had read before a newer revision)."""
    found, shown = [], {}
    for revision, current in _states(revisions):
        at = revision.committed_ms / 1_000
        for name in revision.names:
            number = _number_at(name, current.get(name), at, done)
            if number < shown.get(name, 0):
                found.append(
                    f"r{revision.number} by {revision.host} sets {name} back to edit {number} "
                    f"from edit {shown[name]}"
                )
            shown[name] = max(number, shown.get(name, 0))
    return found


def in_force(
    revisions: list[Revision], done: list[Edit], outage: Outage
) -> tuple[list[str], dict[str, str]]:
    """Edits not in force within their bound, and the worst time from edit to in force
    of each kind of edit (from the first poll, or the database's return, for one made
    before it or while it was out)."""
    late: list[str] = []
    worst: dict[str, tuple[float, str]] = {}
    states = list(_states(revisions))
    for edit in done:
        later = [e for e in done if e.name == edit.name and e.number >= edit.number]
        since, kind = outage.reachable_after(edit.at)
        shown = next(
            (
                revision
                for revision, current in states
                if revision.committed_ms / 1_000 >= edit.at - 0.05
                and _shows(current.get(edit.name), later, revision.committed_ms / 1_000)
            ),
            None,
        )
        kind = "update" if edit.kind == "update" else kind
        bound = IN_FORCE_S + (HASH_EVERY_S if edit.kind == "update" else 0)
        if shown is None:
            late.append(f"edit {edit.number} ({edit.kind} {edit.name}) never in force")
            continue
        lag = shown.fence_ms / 1_000 - since
        if lag >= worst.get(kind, (lag, ""))[0]:
            worst[kind] = (lag, f"edit {edit.number} {edit.kind} {edit.name}, r{shown.number}")
        if lag > bound:
            late.append(
                f"edit {edit.number} ({edit.kind} {edit.name}) in force {lag:.1f}s after "
                f"{'the database could be read' if since > edit.at else 'it'} (r{shown.number})"
            )
    return late, {kind: f"{lag:.1f}s ({which})" for kind, (lag, which) in sorted(worst.items())}


def _shows(data: Any, later: list[Edit], committed: float) -> bool:
    """Whether a row's definition in a revision ``committed`` then (``None``: the row has
    none) is one of the ``later`` edits: its args say which; an absence is a delete of
    them committed before (a row created and deleted before any poll saw it is named by
    no revision, and is in force as soon as one is written)."""
    if data is None:
        return any(e.deletes and e.at <= committed + 0.05 for e in later)
    return _number(data) in {e.number for e in later if not e.deletes}
