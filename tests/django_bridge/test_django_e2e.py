"""Real Celery workers with the bridge on (and its write-back), rows edited through the
ORM, on SQLite and on PostgreSQL: every node sends what the rows say, within seconds of
each change."""

from __future__ import annotations

import json
import os
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery_process import CeleryProcess
from service_check import require_service

from beatless.live import Live
from beatless.stores import open_store

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/13"
HASH_EVERY_S = 3
READY_WITHIN_S = 120
"""How long two workers may take to start: far more than they do, on a loaded machine."""

APP = '''
"""A Celery app of a Django project with the bridge on; its task notes each run."""

import json
import os
import time

import redis
from celery import Celery

import beatless.celery

PREFIX = os.environ["BT_PREFIX"]
app = Celery(PREFIX)
app.conf.update(
    broker_url=os.environ["BT_BROKER"],
    broker_transport_options={"global_keyprefix": PREFIX + ":"},
    task_default_queue=PREFIX,
    worker_enable_remote_control=False,
    beatless_namespace=PREFIX,
    beatless_django=True,
    beatless_django_hash_every=int(os.environ["BT_HASH_EVERY"]),
    beatless_django_write_back=True,
)
beatless.celery.install(app)
_runs = redis.Redis.from_url(os.environ["BT_BROKER"])


@app.task(bind=True, name="dj.record")
def record(self, *args):
    occurrence = beatless.celery.occurrence(self.request)
    _runs.rpush(PREFIX + ":runs", json.dumps({
        "id": self.request.id,
        "args": list(args),
        "occurrence": occurrence.timestamp() if occurrence else None,
        "name": getattr(self.request, "periodic_task_name", None),
        "at": time.time(),
    }))
'''


@pytest.fixture
def redis_client() -> Iterator[Any]:
    require_service("Redis", "127.0.0.1", 6379)
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def fleet(
    tmp_path: Path, database: str, django_project: dict[str, str], redis_client: Any
) -> Iterator[dict[str, Any]]:
    """Two worker nodes of one app, on the test's database; killed at the end."""
    prefix = f"bltest-dj-{uuid.uuid4().hex[:8]}"
    (tmp_path / "dj_app.py").write_text(textwrap.dedent(APP))
    env = {
        **os.environ,
        **django_project,
        "BEATLESS_DJANGO_DB": database,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests"), str(REPO)]),
        "BT_PREFIX": prefix,
        "BT_BROKER": REDIS_URL,
        "BT_HASH_EVERY": str(HASH_EVERY_S),
    }
    processes: list[CeleryProcess] = []

    def start() -> None:
        """Start both nodes (again: each start logs to files of its own), and wait until
        both say they are ready (every bootstep started, the bridge's poll among them)."""
        round_ = len(processes) // 2
        started = [
            CeleryProcess(
                ["-A", "dj_app", "worker", "-n", f"{name}@%h", "-P", "solo", "-l", "INFO",
                 "--without-mingle", "--without-gossip", "--without-heartbeat"],
                tmp_path / (f"{name}.log" if round_ == 0 else f"{name}.{round_}.log"),
            ).start(env, tmp_path)
            for name in ("n1", "n2")
        ]  # fmt: skip
        processes.extend(started)
        ready = wait_for(lambda: all(p.is_ready() for p in started), READY_WITHIN_S)
        assert ready, "\n".join(p.output()[-2_000:] for p in started)

    def kill() -> None:
        """SIGKILL every node's process group, each once (by its own pid)."""
        for process in processes:
            process.kill()

    start()
    store = open_store(REDIS_URL, namespace=prefix)
    try:
        yield {
            "prefix": prefix,
            "live": Live(store, namespace=prefix),
            "dir": tmp_path,
            "start": start,
            "kill": kill,
        }
    finally:
        kill()
        store.close()
        for key in redis_client.scan_iter(match=f"*{prefix}*", count=1_000):
            redis_client.delete(key)


def runs(redis_client: Any, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(r) for r in redis_client.lrange(f"{prefix}:runs", 0, -1)]


def wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


def fence_of(live: Live, name: str, after: float) -> float:
    """The fence (seconds) of the first revision of ``name`` committed after ``after``."""
    for revision in live.history(name):
        if revision.committed_ms / 1_000 >= after:
            return revision.fence_ms / 1_000
    raise AssertionError(f"no revision of {name!r} after {after}")


def run_selected(prefix: str, live: Live) -> None:
    """A yearly row, run now through the admin's action of ``beatless.django.admin``."""
    from celery import Celery
    from django.contrib import admin
    from django.test import RequestFactory
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    from beatless.django.admin import PeriodicTaskAdmin

    yearly = CrontabSchedule.objects.create(minute="0", hour="0", day_of_month="1",
                                            month_of_year="1")  # fmt: skip
    PeriodicTask.objects.create(name="yearly", task="dj.record", crontab=yearly,
                                args='["manual"]')  # fmt: skip
    assert wait_for(lambda: live.get("yearly") is not None, 10)
    app = Celery(prefix, broker=REDIS_URL, set_as_current=False)
    app.conf.update(beatless_namespace=prefix)
    model_admin = PeriodicTaskAdmin(PeriodicTask, admin.site)
    model_admin.celery_app = app
    request = RequestFactory().post("/")
    request._messages = type("Said", (), {"add": lambda *a, **k: None})()
    model_admin.run_tasks(request, PeriodicTask.objects.filter(name="yearly"))


@pytest.mark.slow
def test_rows_edited_through_the_orm_run_on_every_node_as_they_say(
    fleet: dict[str, Any], redis_client: Any
) -> None:
    from django_celery_beat.models import ClockedSchedule, IntervalSchedule, PeriodicTask

    prefix, live = fleet["prefix"], fleet["live"]
    every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
    tick = PeriodicTask.objects.create(name="tick", task="dj.record", interval=every, args="[1]")
    assert wait_for(lambda: any(r["args"] == [1] for r in runs(redis_client, prefix)), 30), (
        fleet["dir"] / "n1.log"
    ).read_text()[-3_000:]

    # An edit through save(): under the new definition from its fence, within 3 s.
    edited = time.time()
    tick.args = "[2]"
    tick.save()
    assert wait_for(lambda: any(r["args"] == [2] for r in runs(redis_client, prefix)), 10)
    fence = fence_of(live, "tick", edited)
    assert fence - edited <= 3.5
    time.sleep(2)
    ticks = [r for r in runs(redis_client, prefix) if r["name"] == "tick"]
    assert all(r["args"] == ([2] if r["occurrence"] >= fence else [1]) for r in ticks)
    first_new = min(r["occurrence"] for r in ticks if r["args"] == [2])
    assert first_new - fence < 1.0  # the first occurrence at or after the fence

    # queryset.update(): no signal, no date_changed; the full pass finds it.
    updated = time.time()
    PeriodicTask.objects.filter(name="tick").update(args="[3]")
    limit = HASH_EVERY_S + 1 + 2 + 2  # a full pass, the poll's second, the fence, a margin
    assert wait_for(lambda: any(r["args"] == [3] for r in runs(redis_client, prefix)), limit)
    assert fence_of(live, "tick", updated) - updated <= HASH_EVERY_S + 3.5

    # A clocked one-off runs once.
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=6)
    clocked = ClockedSchedule.objects.create(clocked_time=when)
    PeriodicTask.objects.create(name="once", task="dj.record", clocked=clocked, one_off=True,
                                args='["once"]')  # fmt: skip
    time.sleep(max(0.0, when.timestamp() - time.time()) + 3)

    # The admin's "Run selected tasks": one manual firing, claimed once by the fleet.
    run_selected(prefix, live)

    # A disabled row stops at its fence.
    disabled = time.time()
    tick.refresh_from_db()
    tick.enabled = False
    tick.save()
    assert wait_for(lambda: live.get("tick") is not None and not live.get("tick").enabled, 10)
    stop = fence_of(live, "tick", disabled)
    time.sleep(3)
    done = runs(redis_client, prefix)
    assert [r["occurrence"] for r in done if r["name"] == "once"] == [when.timestamp()]
    assert [r["args"] for r in done if r["name"] == "yearly"] == [["manual"]]
    assert not [r for r in done if r["name"] == "tick" and r["occurrence"] >= stop]
    assert len({r["id"] for r in done}) == len(done)  # no firing sent twice
    once = PeriodicTask.objects.get(name="once")  # written back by the node that sent it
    assert (once.last_run_at, once.total_run_count) == (when, 1)
    for name in ("n1", "n2"):
        assert "beatless node" in (fleet["dir"] / f"{name}.log").read_text()


@pytest.mark.slow
def test_clocked_one_offs_run_once_across_a_kill_and_a_restart_of_every_node(
    fleet: dict[str, Any], redis_client: Any
) -> None:
    """One one-off runs before every node is killed (-9) and must not run again after the
    restart; another falls while no node runs and runs once, after it."""
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    prefix, live = fleet["prefix"], fleet["live"]
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
    down = soon + timedelta(seconds=6)
    for name, when in (("before", soon), ("during", down)):
        clocked = ClockedSchedule.objects.create(clocked_time=when)
        PeriodicTask.objects.create(name=name, task="dj.record", clocked=clocked,
                                    one_off=True, args=f'["{name}"]')  # fmt: skip
    assert wait_for(lambda: live.get("during") is not None, 20)
    ran = lambda name: [r for r in runs(redis_client, prefix) if r["name"] == name]  # noqa: E731
    assert wait_for(lambda: ran("before"), soon.timestamp() - time.time() + 10)
    fleet["kill"]()
    time.sleep(max(0.0, down.timestamp() - time.time()) + 2)
    fleet["start"]()
    assert wait_for(lambda: ran("during"), 30)
    time.sleep(4)
    assert [r["occurrence"] for r in ran("before")] == [soon.timestamp()]
    assert [r["occurrence"] for r in ran("during")] == [down.timestamp()]
