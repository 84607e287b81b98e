"""Overlap and once-only execution in real ``celery worker`` processes (Redis broker).

Each test runs workers of the app in ``conftest.py`` (``install(app)``: every worker
schedules and checks runs) on the test's own Redis prefix. The tasks note each run's
start and end, with the request's beatless headers, in the Redis lists
``{prefix}:starts`` and ``{prefix}:ends``; the tests read what was skipped or refused
from the workers' logs: the scheduler's decisions (``beatless.decisions`` is at DEBUG in
the test app) and the run checks' own lines (``beatless.node.runs``).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import pytest
from celery import Celery

from beatless.node._prefer import GRACE_MS
from beatless.schedule.firing import firing_id, from_datetime, run_lease_id

pytestmark = pytest.mark.slow

HOURLY: dict[str, Any] = {"schedule": 3600.0, "options": {"beatless": {"max_late": "1h"}}}
"""An entry whose last occurrence the catch-up fires as a node starts (within its
``max_late``), and whose next one does not come during the test (unless it runs across
the hour)."""
SCHEDULER_SKIPPED = re.compile(r"firing (\S+) entry=\S+ .* outcome=skipped_overlap")
WORKER_SKIPPED = re.compile(r"beatless: firing (\S+) of \S+ not run: a run of")
DUPLICATE = re.compile(r"beatless: firing (\S+) of \S+ \(attempt \d+\) not run: another copy")
COUNTS = re.compile(r"beatless runs of node (\S+): (.*)")


def notes(project: Any, redis_client: Any, key: str) -> list[dict[str, Any]]:
    return [json.loads(r) for r in redis_client.lrange(f"{project.prefix}:{key}", 0, -1)]


def runs_of(project: Any, redis_client: Any, first: dict[str, Any]) -> list[dict[str, Any]]:
    """The starts noted for the firing of ``first``."""
    return [s for s in notes(project, redis_client, "starts") if s["id"] == first["id"]]


def unacked(project: Any, redis_client: Any) -> list[str]:
    """The task ids of the messages kombu holds delivered and not acknowledged."""
    raw = redis_client.hvals(f"{project.prefix}:unacked")
    return [json.loads(r)[0]["headers"]["id"] for r in raw]


def occurrence_ms(note: dict[str, Any]) -> int:
    return from_datetime(datetime.fromisoformat(note["headers"]["beatless_occurrence"]))


def found(pattern: re.Pattern[str], *texts: str) -> list[str]:
    return [m.group(1) for text in texts for m in pattern.finditer(text)]


def logs(*processes: Any) -> str:
    return "\n".join(f"--- {p.log.name}\n{p.output()[-4_000:]}" for p in processes)


def send_copy(project: Any, task: str, note: dict[str, Any], args: list[Any]) -> None:
    """Send the message of a firing again, as a second copy: the same task id and the
    same beatless headers, as a broker redelivery or a second publish would carry."""
    app = Celery(project.prefix, broker=project.env["BT_BROKER"], set_as_current=False)
    app.conf.update(
        broker_transport_options={"global_keyprefix": project.prefix + ":"},
        task_default_queue=project.prefix,
    )
    try:
        app.send_task(task, args=args, task_id=note["id"], headers=note["headers"])
    finally:
        app.close()


def run_lease(project: Any, redis_client: Any, entry: str) -> tuple[str, int] | None:
    """``(state, until_ms)`` of the run-lease record of ``entry``'s address, if any."""
    key = f"beatless:{project.prefix}:claim:{run_lease_id(f'{project.prefix}/{entry}')}"
    record = redis_client.get(key)
    if record is None:
        return None
    parts = record.decode().split("|")
    return parts[1], int(parts[2])


# -- (a) overlap "skip": never two runs at once, every occurrence accounted for ------------


def test_overlap_skip_never_runs_two_at_once_and_accounts_for_every_occurrence(
    project: Any, redis_client: Any
) -> None:
    """An entry every 2 s whose task sleeps 7 s (three periods), overlap ``skip``, on
    two workers able to run four tasks at once (prefork and threads, two each). The
    runs never intersect; every occurrence of the window either ran or was counted
    ``skipped_overlap`` (by the scheduler that claimed it, or by the worker that
    refused its run), exactly one of those, none lost.

    The scheduler sees the run lease as it claims and does not enqueue a firing while a
    run is in progress; a copy of the entry's message under another task id, sent during
    the first run, is enqueued all the same, and the worker refuses it."""
    beatless = {"overlap": "skip", "run_lease": 6, "heartbeat": 2}
    project.configure(
        {
            "slow": {
                "task": "beatless_test.sleepy",
                "schedule": 2.0,
                "args": [7],
                "options": {"beatless": beatless},
            }
        },
    )
    workers = [
        project.worker("pf", "-P", "prefork", "-c", "2", install=True),
        project.worker("th", "-P", "threads", "-c", "2", install=True),
    ]
    stranger = str(uuid.uuid4())
    try:
        assert project.wait_for(lambda: notes(project, redis_client, "starts"), 30), logs(*workers)
        first = notes(project, redis_client, "starts")[0]
        send_copy(project, "beatless_test.sleepy", {**first, "id": stranger}, [7])
        ended = project.wait_for(lambda: len(notes(project, redis_client, "ends")) >= 3, 40)
        assert ended, logs(*workers)
        stopped_at = time.time()
    finally:
        for worker in workers:
            worker.kill()
    text = "\n".join(w.output() for w in workers)
    starts = notes(project, redis_client, "starts")
    ends = {n["id"]: n["at"] for n in notes(project, redis_client, "ends")}

    intervals = sorted((s["at"], ends.get(s["id"], stopped_at), s["id"]) for s in starts)
    for (_, end, one), (start, _, other) in itertools.pairwise(intervals):
        assert end < start, f"runs {one} and {other} overlap: {intervals}"

    address = f"{project.prefix}/slow"
    low = min(occurrence_ms(s) for s in starts)
    high = int(stopped_at * 1_000) - 1_500  # every occurrence up to here was decided
    window = {firing_id(address, o): o for o in range(low, high + 1, 2_000)}
    ran = Counter(s["id"] for s in starts)
    by_scheduler = Counter(found(SCHEDULER_SKIPPED, text))
    by_worker = Counter(found(WORKER_SKIPPED, text))
    for fid, occurrence in window.items():
        fates = ran[fid] + by_scheduler[fid] + by_worker[fid]
        assert fates == 1, (
            f"occurrence {occurrence} ({fid}): ran {ran[fid]}, skipped by a scheduler "
            f"{by_scheduler[fid]}, refused by a worker {by_worker[fid]}\n{logs(*workers)}"
        )
    assert max(ran.values()) == 1
    skipped = sum(by_scheduler[f] + by_worker[f] for f in window)
    print(
        f"{len(window)} occurrences: {sum(ran[f] for f in window)} ran, {skipped} skipped "
        f"({sum(by_scheduler[f] for f in window)} by a scheduler, "
        f"{sum(by_worker[f] for f in window)} by a worker); runs: "
        + ", ".join(f"{end - start:.2f}s" for start, end, _ in intervals)
    )
    assert sum(ran[f] for f in window) >= 3
    assert skipped >= 6
    assert stranger in by_worker, "the copy under another id was not refused"
    assert stranger not in ran, "the copy under another id ran"
    assert "Traceback" not in text, logs(*workers)


# -- (b) a worker killed mid-run frees the address run_lease after its last heartbeat -----


def test_a_killed_run_frees_its_address_a_run_lease_after_its_last_heartbeat(
    project: Any, redis_client: Any
) -> None:
    """An entry every 2 s, overlap ``skip``, run lease 6 s renewed every 2 s, whose task
    sleeps 40 s; two workers. A few seconds into the first run, right after a heartbeat,
    the worker running it is killed whole (SIGKILL to its process group: main process
    and pool child). The other worker starts no run until the killed run's lease ran
    out (last heartbeat + run_lease, read from the record itself), then starts the next
    occurrence (a grace later if the killed node is its preferred claimer). The killed
    firing is not run again (early acknowledgement: no copy)."""
    beatless = {"overlap": "skip", "run_lease": 6, "heartbeat": 2}
    project.configure(
        {
            "long": {
                "task": "beatless_test.sleepy",
                "schedule": 2.0,
                "args": [40],
                "options": {"beatless": beatless},
            }
        }
    )
    workers = {
        name: project.worker(name, "-P", "prefork", "-c", "1", install=True)
        for name in ("one", "two")
    }
    try:
        assert project.wait_for(lambda: notes(project, redis_client, "starts"), 30), logs(
            *workers.values()
        )
        (first,) = notes(project, redis_client, "starts")
        victim = workers[first["hostname"].split("@")[0]]
        survivor = next(w for w in workers.values() if w is not victim)
        time.sleep(max(first["at"] + 2.5 - time.time(), 0))
        before = run_lease(project, redis_client, "long")
        assert before is not None
        assert before[0] == "pending", before
        renewed = project.wait_for(
            lambda: run_lease(project, redis_client, "long") != before, 3, interval=0.02
        )
        assert renewed, "no heartbeat renewed the run lease"
        victim.kill()
        killed_at = time.time()
        lease = run_lease(project, redis_client, "long")
        assert lease is not None
        assert lease[0] == "pending", lease
        until_ms = lease[1]
        started = project.wait_for(lambda: len(notes(project, redis_client, "starts")) >= 2, 25)
        assert started, logs(*workers.values())
    finally:
        for worker in workers.values():
            worker.kill()
    starts = notes(project, redis_client, "starts")
    second = starts[1]
    last_heartbeat_ms = until_ms - 6_000
    gap_ms = second["at"] * 1_000 - last_heartbeat_ms
    text = survivor.output()
    refused = found(SCHEDULER_SKIPPED, text) + found(WORKER_SKIPPED, text)
    print(
        f"killed {killed_at - last_heartbeat_ms / 1_000:.2f}s after the last heartbeat; next "
        f"run started {gap_ms / 1_000:.2f}s after it (run_lease 6s), "
        f"{(second['at'] - killed_at):.2f}s after the kill; {len(refused)} firings skipped "
        f"meanwhile"
    )
    assert second["hostname"].startswith("two@" if victim is workers["one"] else "one@")
    assert second["at"] * 1_000 >= until_ms, "a run started while the killed run's lease held"
    # After the lease: the next occurrence (within a period), claimed at its release by the
    # survivor, or a grace later when the killed node, still in the registry (15 s), is the
    # preferred claimer of that firing; and a moment for the run to start.
    late_ms = 6_000 + 2_000 + GRACE_MS + 1_500
    assert gap_ms <= late_ms, "the next run came late after the lease ran out"
    # At least the firing released within a period of the kill is refused while the lease
    # holds; the next ones may be claimed only after it ran out (a preferred-claimer grace
    # when the killed node was preferred for them), and then they run.
    assert len(refused) >= 1, logs(survivor)
    assert [s["id"] for s in starts].count(first["id"]) == 1
    assert "Traceback" not in text, logs(survivor)


# -- (c) a second copy of a firing's message runs nothing --------------------------------

POOLS = {
    "prefork": (("-P", "prefork", "-c", "2"), {}),
    "spawn": (("-P", "prefork", "-c", "2"), {"worker_pool_start_method": "spawn"}),
    "threads": (("-P", "threads", "-c", "2"), {}),
    "solo": (("-P", "solo"), {}),
}


@pytest.mark.parametrize("pool", list(POOLS))
def test_a_second_copy_of_a_firing_is_refused_as_a_duplicate(
    pool: str, project: Any, redis_client: Any
) -> None:
    """A firing's message sent again with the same task id and headers, once while the
    first copy runs (not with the solo pool, which runs one task at a time) and once
    after it ended: the body runs once, each copy is counted ``duplicate`` (and the
    counts are logged when the worker stops)."""
    args, conf = POOLS[pool]
    project.configure({"once": {**HOURLY, "task": "beatless_test.sleepy", "args": [3]}}, **conf)
    worker = project.worker(pool, *args, install=True)
    try:
        assert project.wait_for(lambda: notes(project, redis_client, "starts"), 30), logs(worker)
        first = notes(project, redis_client, "starts")[0]
        send_copy(project, "beatless_test.sleepy", first, [3])  # while the first runs
        assert project.wait_for(
            lambda: any(e["id"] == first["id"] for e in notes(project, redis_client, "ends")), 15
        )
        send_copy(project, "beatless_test.sleepy", first, [3])  # after it ended
        refused = project.wait_for(
            lambda: found(DUPLICATE, worker.output()).count(first["id"]) == 2, 15
        )
        assert refused, logs(worker)
        time.sleep(0.5)
    finally:
        code = worker.stop()
    text = worker.output()
    ran = [s["id"] for s in notes(project, redis_client, "starts")]
    assert ran.count(first["id"]) == 1, ran
    assert text.count(f"beatless_test.sleepy[{first['id']}] ignored") == 2, logs(worker)
    counts = [dict(kv.split("=") for kv in m.group(2).split(", ")) for m in COUNTS.finditer(text)]
    assert sum(int(c.get("duplicate", 0)) for c in counts) == 2, logs(worker)
    assert code == 0, logs(worker)
    assert "Traceback" not in text, logs(worker)


# -- (d) acks_late: the redelivery of a run that finished is refused -------------------------


def test_acks_late_redelivery_of_a_finished_run_is_refused(project: Any, redis_client: Any) -> None:
    """``acks_late``: the first worker runs the firing, ends the run (its once-only record
    committed), and is killed whole before it acknowledges the message. Kombu gives the
    message back after the (short) visibility timeout to the next worker, which refuses
    it as a duplicate and acknowledges it."""
    transport = {
        "global_keyprefix": project.prefix + ":",
        "visibility_timeout": 3,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    project.configure(
        {"die": {**HOURLY, "task": "beatless_test.finish_then_die"}},
        broker_transport_options=transport,
    )
    first_worker = project.worker("first", "-P", "prefork", "-c", "1", install=True)
    assert project.wait_for(lambda: first_worker.process.poll() is not None, 30), logs(first_worker)
    (first,) = notes(project, redis_client, "starts")
    assert unacked(project, redis_client) == [first["id"]], "the message was acknowledged"
    second_worker = project.worker("second", "-P", "prefork", "-c", "1", install=True)
    try:
        refused = project.wait_for(
            lambda: first["id"] in found(DUPLICATE, second_worker.output()), 20
        )
        assert refused, logs(first_worker, second_worker)
        acked = project.wait_for(lambda: not unacked(project, redis_client), 5)
    finally:
        second_worker.stop()
    assert acked, "the refused copy was not acknowledged"
    assert [s["id"] for s in notes(project, redis_client, "starts")].count(first["id"]) == 1
    assert "Traceback" not in second_worker.output(), logs(second_worker)


def test_acks_late_redelivery_after_a_crash_reruns_once_the_run_lease_lapsed(
    project: Any, redis_client: Any
) -> None:
    """``acks_late``: the worker running a firing is killed whole mid-run; its message is
    given back after the visibility timeout (8 s), later than the dead run's records
    lapse (run lease 4 s after the last heartbeat): the next worker runs it again,
    counted ``rerun``."""
    transport = {
        "global_keyprefix": project.prefix + ":",
        "visibility_timeout": 8,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    beatless = {"run_lease": 4, "heartbeat": 1}
    project.configure(
        {
            "crash": {
                "task": "beatless_test.sleepy",
                "schedule": 3600.0,
                "args": [20],
                "options": {"beatless": {**HOURLY["options"]["beatless"], **beatless}},
            }
        },
        broker_transport_options=transport,
        task_acks_late=True,
    )
    first_worker = project.worker("first", "-P", "prefork", "-c", "1", install=True)
    try:
        assert project.wait_for(lambda: notes(project, redis_client, "starts"), 30), logs(
            first_worker
        )
        time.sleep(1.5)
    finally:
        first_worker.kill()
    killed_at = time.time()
    (first,) = notes(project, redis_client, "starts")
    second_worker = project.worker("second", "-P", "prefork", "-c", "1", install=True)
    try:
        rerun = project.wait_for(lambda: len(runs_of(project, redis_client, first)) >= 2, 30)
        assert rerun, logs(first_worker, second_worker)
    finally:
        second_worker.kill()
    again = runs_of(project, redis_client, first)[1]
    text = second_worker.output()
    print(
        f"killed {killed_at - first['at']:.1f}s into the run; delivered again and rerun "
        f"{again['at'] - killed_at:.1f}s after the kill"
    )
    assert again["redelivered"]
    assert again["at"] - killed_at >= 4 - 1, "rerun before the dead run's lease could lapse"
    assert f"firing {first['id']} of" in text
    assert "runs again: an earlier copy started and its worker stopped renewing" in text, logs(
        second_worker
    )
