"""Run policies on the Celery side: the settings, the header, and the check at task start.

The check is exercised here through eager ``apply`` with the message's headers, on a
``memory://`` claim store, once the worker's ``worker_init`` signal armed it; real
workers and brokers are in ``test_celery_runs_e2e.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, signals
from celery.exceptions import Retry

import beatless.celery
from beatless.celery import BeatlessStep, check_app, read_schedule
from beatless.celery._gate import RunGate, find_gate
from beatless.celery._messages import ADDRESS_HEADER, send_task_options
from beatless.celery._settings import CelerySettings
from beatless.celery._worker import StartRefused
from beatless.core.triggers import Every
from beatless.errors import ScheduleError, StoreUnavailable
from beatless.node.runs import RUN_HEADER, RunPolicy
from beatless.schedule.entry import Entry
from beatless.schedule.firing import Firing


def make_app(schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update({"beat_schedule": schedule or {}, "beatless_store_url": "memory://", **conf})
    return app


class Worker:
    """What ``worker_init`` sends: the worker, with its app and node name."""

    def __init__(self, app: Celery, hostname: str) -> None:
        self.app, self.hostname = app, hostname


def entry(name: str, **beatless: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"task": "proj.work", "schedule": 60}
    if beatless:
        spec["options"] = {"beatless": beatless}
    return {name: spec}


# -- settings ---------------------------------------------------------------------------


def test_run_settings_come_from_the_entry_or_the_app_defaults() -> None:
    app = make_app(
        {
            **entry("plain"),
            **entry("own", overlap="allow", run_lease="1m", heartbeat=20, once_only=True),
        },
        beatless_overlap="skip",
        beatless_run_lease="10s",
        beatless_heartbeat=3,
        beatless_once_only=False,
    )
    by_name = {e.name: e for e in read_schedule(app).entries}
    plain, own = by_name["plain"], by_name["own"]
    assert (plain.overlap, plain.run_lease, plain.heartbeat, plain.once_only) == (
        "skip",
        timedelta(seconds=10),
        timedelta(seconds=3),
        False,
    )
    assert (own.overlap, own.run_lease, own.heartbeat, own.once_only) == (
        "allow",
        timedelta(minutes=1),
        timedelta(seconds=20),
        True,
    )
    defaults = read_schedule(make_app(entry("d"))).entries[0]
    assert (defaults.overlap, defaults.once_only) == ("allow", True)
    assert (defaults.run_lease, defaults.heartbeat) == (timedelta(seconds=30), timedelta(seconds=5))


def test_bad_run_settings_of_entries_are_problems_each_naming_its_entry() -> None:
    app = make_app(
        {
            **entry("fine", overlap="skip"),
            **entry("sometimes", overlap="sometimes"),
            **entry("buffered", overlap="buffer_one"),
            **entry("soon", run_lease="soon"),
            **entry("eager", run_lease=4, heartbeat=2),
            **entry("yes", once_only="yes"),
        }
    )
    problems = check_app(app).problems
    assert {p.split("'")[1] for p in problems} == {"sometimes", "buffered", "soon", "eager", "yes"}
    said = "\n".join(problems)
    assert "entry 'sometimes': overlap must be one of 'allow', 'skip'" in said
    assert "overlap 'buffer_one' is not offered" in said
    assert "entry 'soon': run_lease" in said
    assert "entry 'eager': heartbeat 2s must be under half the run_lease 4s" in said
    assert "entry 'yes': once_only must be true or false" in said


def test_bad_app_wide_run_settings_are_problems_said_once() -> None:
    app = make_app(
        {**entry("a"), **entry("b")},
        beatless_overlap="never",
        beatless_once_only="yes",
        beatless_run_lease=4,
        beatless_heartbeat=2,
    )
    problems = check_app(app).problems
    assert [p.split(" ")[0].rstrip(":") for p in problems] == [
        "beatless_overlap",
        "beatless_once_only",
        "beatless_heartbeat",
    ]
    assert "beatless_heartbeat 2s must be under half the beatless_run_lease 4s" in problems[2]
    bad = make_app(beatless_run_lease="soon", beatless_heartbeat=60)
    assert [p.split(":")[0] for p in check_app(bad).problems] == ["beatless_run_lease"]


def test_overlap_skip_on_a_rabbitmq_claim_store_is_accepted() -> None:
    """The RabbitMQ store renews run leases without a gap; its workers enforce the skip."""
    schedule = {**entry("skips", overlap="skip"), **entry("allows")}
    for url in ("amqp://guest:guest@rabbit:5672/%2F", "amqps://rabbit/%2F", "redis://r:6379/0"):
        assert check_app(make_app(schedule, beatless_store_url=url)).is_sound


@pytest.mark.parametrize("mode", ["refuse", "consume"])
def test_what_the_opened_store_refuses_is_a_start_up_problem_too(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A problem known only once the store is open (what it remembers) is refused, or
    consumed, like the others."""
    import beatless.celery._worker as worker_module

    said = "entry 'd': jitter 0s + max_late 1m + tolerance 10s = 1m10s must be under ..."

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ScheduleError(said, [said])

    monkeypatch.setattr(worker_module, "build_scheduler", refused)
    app = make_app(entry("d"), beatless_on_schedule_error=mode)
    step = BeatlessStep(Worker(app, "w"))
    if mode == "refuse":
        with pytest.raises(StartRefused) as caught:
            step.start(Worker(app, "w"))
        assert "this node refuses to start" in caught.value.reason
        assert caught.value.problems == (said,)
    else:
        step.start(Worker(app, "w"))
        assert step.schedule_problems == (said,)
    assert step.scheduler is None


def test_settings_repr_shows_the_run_settings() -> None:
    text = repr(CelerySettings.from_app(make_app(beatless_overlap="skip")))
    assert "overlap='skip'" in text
    assert "once_only=True" in text


# -- the header -------------------------------------------------------------------------


def test_every_firing_message_carries_its_entry_run_policy() -> None:
    skip = Entry(
        name="e", task="proj.work", trigger=Every(60), overlap="skip", run_lease=6, heartbeat=2
    )
    firing = Firing.of(skip, None, "proj/e", 1_700_000_040_000)
    headers = send_task_options(firing)["headers"]
    assert headers[RUN_HEADER] == RunPolicy.of_entry(skip).encode()
    assert RunPolicy.decode(headers[RUN_HEADER]) == RunPolicy("skip", 6_000, 2_000, True, 70_000)
    plain = Entry(name="p", task="proj.work", trigger=Every(60), options={"headers": {"x": 1}})
    headers = send_task_options(Firing.of(plain, None, "proj/p", 1_700_000_040_000))["headers"]
    assert RunPolicy.decode(headers[RUN_HEADER]) == RunPolicy.of_entry(plain)
    assert headers["x"] == 1


# -- the check at task start --------------------------------------------------------------


@pytest.fixture
def app() -> Iterator[Celery]:
    """An installed app with one bound task, armed as a worker's ``worker_init`` arms it."""
    app = make_app()
    calls: list[tuple[str, int, Any]] = []

    @app.task(bind=True, name="proj.work", shared=False)
    def work(self: Any, value: Any = None, fail: BaseException | None = None) -> Any:
        calls.append((self.request.id, self.request.retries, value))
        if isinstance(value, threading.Event):
            value.wait(5)
        if fail is not None:
            raise fail
        return value

    app.calls = calls  # type: ignore[attr-defined]
    beatless.celery.install(app)
    signals.worker_init.send(sender=Worker(app, "w1@host"))
    yield app
    gate = find_gate(app)
    assert gate is not None
    gate.close()


def headers(address: str = "proj/e", **policy: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"overlap": "allow", "lease_ms": 6_000, "heartbeat_ms": 2_000}
    values.update({"once_only": True, "memory_ms": 70_000, **policy})
    return {RUN_HEADER: RunPolicy(**values).encode(), ADDRESS_HEADER: address}


def gate_of(app: Celery) -> RunGate:
    gate = find_gate(app)
    assert gate is not None
    return gate


def test_worker_init_wraps_every_task_of_the_app_but_celerys_own_once(app: Celery) -> None:
    gate = gate_of(app)
    assert gate.armed
    assert gate.hostname == "w1@host"
    assert "proj.work" in gate.guarded
    assert not [name for name in gate.guarded if name.startswith("celery.")]
    assert gate.arm("w1@host") == []
    assert find_gate(Celery("other", set_as_current=False)) is None


def test_a_second_copy_of_a_firing_is_ignored_and_its_body_never_runs(app: Celery) -> None:
    work = app.tasks["proj.work"]
    first = work.apply((1,), task_id="f-1", headers=headers())
    second = work.apply((2,), task_id="f-1", headers=headers())
    assert (first.state, second.state) == ("SUCCESS", "IGNORED")
    assert app.calls == [("f-1", 0, 1)]  # type: ignore[attr-defined]
    assert gate_of(app).counts() == {"run": 1, "duplicate": 1}
    runs = gate_of(app).runs()
    assert runs.node.startswith("w1@host:")
    assert runs.active() == 0


def test_a_task_without_the_header_or_with_nothing_to_check_runs_untouched(app: Celery) -> None:
    work = app.tasks["proj.work"]
    for _ in range(2):
        assert work.apply((1,), task_id="mine").state == "SUCCESS"
        nothing = headers(once_only=False)
        assert work.apply((2,), task_id="loose", headers=nothing).state == "SUCCESS"
        unreadable = {RUN_HEADER: "v9|what", ADDRESS_HEADER: "proj/e"}
        assert work.apply((3,), task_id="odd", headers=unreadable).state == "SUCCESS"
    assert len(app.calls) == 6  # type: ignore[attr-defined]
    assert gate_of(app).counts() == {}
    assert work(4) == 4  # a direct call, as before


def test_each_celery_retry_is_a_new_attempt(app: Celery) -> None:
    work = app.tasks["proj.work"]
    states = [work.apply((n,), task_id="f-2", headers=headers(), retries=n).state for n in (0, 1)]
    again = work.apply((1,), task_id="f-2", headers=headers(), retries=1)
    assert states == ["SUCCESS", "SUCCESS"]
    assert again.state == "IGNORED"
    assert [c[1] for c in app.calls] == [0, 1]  # type: ignore[attr-defined]


def test_overlap_skip_refuses_another_firing_of_the_address_while_one_runs(app: Celery) -> None:
    work = app.tasks["proj.work"]
    skip = headers(overlap="skip")
    release = threading.Event()
    running = threading.Thread(
        target=lambda: work.apply((release,), task_id="f-a", headers=skip), daemon=True
    )
    running.start()
    try:
        assert _until(lambda: len(app.calls) == 1)  # type: ignore[attr-defined]
        during = work.apply((2,), task_id="f-b", headers=skip)
        elsewhere = work.apply((3,), task_id="f-c", headers=headers("proj/other", overlap="skip"))
    finally:
        release.set()
        running.join(5)
    after = work.apply((4,), task_id="f-d", headers=skip)
    assert (during.state, elsewhere.state, after.state) == ("IGNORED", "SUCCESS", "SUCCESS")
    assert gate_of(app).counts() == {"run": 3, "skipped_overlap": 1}
    # the skipped firing is handled: a later copy of it is refused as well
    assert work.apply((5,), task_id="f-b", headers=skip).state == "IGNORED"


@pytest.mark.parametrize("fail", [RuntimeError("boom"), Retry("again")], ids=["error", "retry"])
def test_a_run_is_ended_however_its_body_ends(app: Celery, fail: BaseException) -> None:
    """An exception or a retry ends the run: the run lease is released at once (the next
    firing runs) and the attempt is committed (a copy of it is refused)."""
    work = app.tasks["proj.work"]
    skip = headers(overlap="skip")
    failed = work.apply((1, fail), task_id="f-x", headers=skip)
    assert failed.state in ("FAILURE", "RETRY")
    assert work.apply((2,), task_id="f-y", headers=skip).state == "SUCCESS"
    assert work.apply((3,), task_id="f-x", headers=skip).state == "IGNORED"
    assert gate_of(app).runs().active() == 0


def test_a_store_that_cannot_be_opened_gives_up_once_only_and_refuses_skip(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = gate_of(app)

    def unreachable() -> Any:
        raise StoreUnavailable("no store today")

    monkeypatch.setattr(gate, "_open_store", unreachable)
    app.conf.beatless_check_wait = 0  # given up at once (the wait: test_runs_wait.py)
    work = app.tasks["proj.work"]
    assert work.apply((1,), task_id="f-u", headers=headers()).state == "SUCCESS"
    assert work.apply((2,), task_id="f-s", headers=headers(overlap="skip")).state == "IGNORED"
    assert gate.counts() == {"unchecked": 1, "skipped_overlap": 1}


def test_a_store_the_settings_cannot_name_counts_as_unreachable(app: Celery) -> None:
    app.conf.beatless_store_url = "ftp://nowhere"
    work = app.tasks["proj.work"]
    assert work.apply((1,), task_id="f-n", headers=headers()).state == "SUCCESS"
    assert gate_of(app).counts() == {"unchecked": 1}


def test_the_check_wait_is_an_app_setting_the_runs_of_each_worker_process_take() -> None:
    assert CelerySettings.from_app(make_app()).check_wait == timedelta(seconds=30)
    app = make_app(beatless_check_wait="2s")
    assert CelerySettings.from_app(app).check_wait == timedelta(seconds=2)
    gate = RunGate(app)
    assert gate.runs().check_wait == timedelta(seconds=2)
    gate.close()
    with pytest.raises(ScheduleError, match="beatless_check_wait: must be zero or more"):
        CelerySettings.from_app(make_app(beatless_check_wait=-1))
    # Settings that name no store: the default, and no store to wait for anyway.
    assert RunGate(make_app(beatless_store_url=7)).runs().check_wait == timedelta(seconds=30)


def test_the_step_exposes_the_gate_and_its_counts(app: Celery) -> None:
    step = BeatlessStep(Worker(app, "w1@host"))
    assert step.runs is gate_of(app)
    app.tasks["proj.work"].apply((1,), task_id="f-c", headers=headers())
    assert step.runs.counts() == {"run": 1}
    assert BeatlessStep(Worker(make_app(), "w")).runs is None


def _until(predicate: Any, timeout: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
