"""Pause, resume and run-now through the store (``beatless.fleet._controls``), honoured by every
node at its next sync, each with an audit record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_status import NS, Fleet, schedule

from beatless.errors import ConfigError
from beatless.fleet._controls import set_control
from beatless.fleet._notes import history_kind
from beatless.schedule.firing import firing_id
from beatless.stores import MemoryStore, open_store


def sent(fleet: Fleet, entry: str) -> list[str]:
    return [id_ for name, id_ in fleet.sent if name == entry]


def history(fleet: Fleet, entry: str) -> list[dict]:  # type: ignore[type-arg]
    kind = history_kind(f"{NS}/{entry}")
    return [json.loads(v) for v in fleet.store.read_notes([kind])[kind].values()]


def test_a_paused_entry_is_not_claimed_by_any_node_and_counted_paused_until_resumed() -> None:
    fleet = Fleet()
    fleet.run(3)
    before = len(sent(fleet, "tick"))
    control = set_control(fleet.store, NS, "pause", "tick")
    fleet.run(1)  # every node reads it within a sync
    during = len(sent(fleet, "tick"))

    fleet.run(5)

    assert len(sent(fleet, "tick")) == during <= before + 1
    paused = [h for h in history(fleet, "tick") if h["outcome"] == "paused"]
    assert len(paused) >= 4
    assert all(n.stats["tick"].paused >= 4 for n in fleet.nodes)
    status = fleet.status()
    tick = next(e for e in status["entries"] if e["entry"] == "tick")
    assert tick["paused"] is True
    assert tick["missed"] == 0  # paused firings are not missed
    assert tick["control"]["by"] == control.by
    assert status["problems"] == []
    assert [a["action"] for a in status["audit"]] == ["pause"]

    set_control(fleet.store, NS, "resume", "tick")
    fleet.run(1)
    resumed = len(sent(fleet, "tick"))
    fleet.run(3)

    assert len(sent(fleet, "tick")) >= resumed + 2
    status = fleet.status()
    assert next(e for e in status["entries"] if e["entry"] == "tick")["paused"] is False
    assert [a["action"] for a in status["audit"]] == ["pause", "resume"]


def test_a_pause_until_ends_by_itself() -> None:
    fleet = Fleet()
    fleet.run(1)
    set_control(fleet.store, NS, "pause", "tick", until_ms=fleet.store.time_ms() + 3_000)
    fleet.run(1)
    paused_at = len(sent(fleet, "tick"))
    fleet.run(1)
    assert len(sent(fleet, "tick")) == paused_at

    fleet.run(4)

    assert len(sent(fleet, "tick")) >= paused_at + 2


def test_run_now_makes_one_manual_firing_sent_by_exactly_one_node() -> None:
    fleet = Fleet()
    fleet.run(1)
    before = set(sent(fleet, "slow"))
    control = set_control(fleet.store, NS, "run-now", "slow")

    fleet.run(3)

    manual = [h for h in history(fleet, "slow") if h["manual"]]
    assert len(manual) == 1
    (item,) = manual
    assert item["outcome"] in ("won", "takeover")
    assert item["occurrence_ms"] == control.at_ms
    assert item["id"] != firing_id(f"{NS}/slow", control.at_ms)  # not a scheduled id
    assert item["id"] in set(sent(fleet, "slow")) - before
    assert sent(fleet, "slow").count(item["id"]) == 1
    # Read again at later syncs, the request does not fire again.
    fleet.run(2)
    assert sent(fleet, "slow").count(item["id"]) == 1


def test_the_cli_pauses_resumes_and_runs_now_through_a_store_it_shares_with_nodes(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    store = open_store(url, namespace=NS)
    from beatless.node.scheduler import Scheduler

    node = Scheduler(schedule(), store=store, node="n0", enqueue=lambda f: None, lease="2s")
    node.tick()
    node.board.sync()  # publishes the entries, so the CLI knows them without a schedule

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "beatless", *args, "--store", url, "--namespace", NS],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    paused = cli("pause", "tick", "--until", "1h")
    assert paused.returncode == 0, paused.stderr
    assert "'tick'" in paused.stdout
    assert "paused until" in paused.stdout
    node.board.sync()
    assert node.board.paused("tick", node.now_ms()) is not None

    assert cli("resume", "tick").returncode == 0
    node.board.sync()
    assert node.board.paused("tick", node.now_ms()) is None

    ran = cli("run-now", "slow")
    assert ran.returncode == 0, ran.stderr
    node.board.sync()
    assert [c.entry for c in node.board.take_run_now()] == ["slow"]

    unknown = cli("pause", "nosuch")
    assert unknown.returncode == 2
    assert "no entry named 'nosuch'" in unknown.stderr
    assert "slow, tick" in unknown.stderr
    past = cli("pause", "tick", "--until", "2001-01-01T00:00:00Z")
    assert past.returncode == 2
    assert "not in the future" in past.stderr

    status = cli("status", "--json")
    assert status.returncode in (0, 1)
    actions = [a["action"] for a in json.loads(status.stdout)["audit"]]
    assert actions == ["pause", "resume", "run-now"]
    store.close()


@pytest.mark.parametrize("command", ["pause", "resume", "run-now"])
def test_a_control_needs_a_store(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "beatless", command, "tick"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "--store" in done.stderr


def test_explain_says_what_happened_to_a_past_firing_from_the_history(tmp_path: Path) -> None:
    from beatless.cli._explain import what_happened

    fleet = Fleet()
    plan = schedule()
    tick = plan.entry("tick")
    start = fleet.clock.now_ms()
    fleet.run(3)
    set_control(fleet.store, NS, "pause", "tick")
    fleet.run(3)
    fleet.clock.advance(30_000)  # frozen past max_late: missed firings
    fleet.run(13)  # the history keeps the last 50 occurrences: the first ones stay

    def said(offset_s: int) -> str:
        return what_happened(fleet.store, plan, tick, None, start + offset_s * 1_000)

    assert said(1).startswith("fired: sent by node n")
    assert "ms after its release" in said(1)
    assert said(5).startswith("skipped by node n")
    assert "paused by an operator" in said(5)
    assert said(10).startswith("missed: no node claimed it within max_late (found by node n")
    assert said(-3_600).startswith("not in the history")
    assert "catch_up 'latest'" in said(-3_600)


def test_explain_with_a_store_reads_the_history_from_the_command_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    plan_file = tmp_path / "schedule.toml"
    plan_file.write_text(
        f'namespace = "{NS}"\n\n[[entry]]\nname = "tick"\ntask = "tests.tick"\nevery = "1s"\n'
        'max_late = "5s"\n\n[[entry]]\nname = "slow"\ntask = "tests.slow"\nevery = "10s"\n'
    )
    from beatless.cli.loader import load_schedule
    from beatless.node.scheduler import Scheduler

    plan = load_schedule(str(plan_file))
    store = open_store(url, namespace=plan.namespace)
    node = Scheduler(plan, store=store, node="n0", enqueue=lambda f: None)
    import time

    deadline = time.monotonic() + 10
    won = None
    while won is None and time.monotonic() < deadline:
        decisions = node.tick()
        won = next(
            (d for d in decisions if d.outcome == "won" and d.firing.entry.name == "tick"), None
        )
        time.sleep(0.1)
    assert won is not None
    node.board.sync()
    store.close()

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "beatless",
            "explain",
            str(plan_file),
            "tick",
            "--at",
            won.firing.occurrence.isoformat(),
            "--store",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "  happened    fired: sent by node n0, " in done.stdout


class ShortNotes(MemoryStore):
    """A memory store that keeps notes at most 10 s, as a stream with a retention does."""

    notes_live_ms = 10_000

    def post(self, notes):  # type: ignore[no-untyped-def]
        for note in notes:
            if note.ttl_ms > self.notes_live_ms:
                raise ConfigError(f"ttl_ms {note.ttl_ms} is over {self.notes_live_ms}")
        super().post(notes)


def test_a_pause_outlives_a_store_that_keeps_notes_a_short_time() -> None:
    fleet = Fleet()
    fleet.store = ShortNotes(clock=fleet.clock)
    fleet.nodes = [fleet.node(f"n{i}") for i in range(3)]
    fleet.run(1)
    set_control(fleet.store, NS, "pause", "tick")
    fleet.run(1)
    paused_at = len(sent(fleet, "tick"))

    fleet.run(40)  # four times what the store keeps a note

    assert len(sent(fleet, "tick")) == paused_at
    status = fleet.status(schedule())
    assert next(e for e in status["entries"] if e["entry"] == "tick")["paused"] is True
