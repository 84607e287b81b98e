"""Running a fault scenario: three real node processes, their files, and the report.

A :class:`Fleet` starts :mod:`fault_node` processes from one shared configuration plus
per-node overrides, signals them by pid (SIGSTOP, SIGCONT), and stops them (SIGTERM,
then SIGKILL) even when the test fails. :meth:`Fleet.report` reads their records and
summaries and counts what went wrong with :mod:`analysis`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis import Fault, Report, analyse, read_records, read_summaries, record
from fault_node import build_schedule

import beatless
from beatless import Firing

NODE_SCRIPT = Path(__file__).with_name("fault_node.py")
CODE_ROOT = Path(beatless.__file__).resolve().parents[1]
"""The root of the beatless the tests import: the nodes run the same code."""
STOP_TIMEOUT_S = 15.0
TOLD_IN_WINDOW = re.compile(
    r"firing (\S+) of entry \S+: (?:its claim ran out before commit|sent, but its commit "
    r"has failed until)"
)
"""A node's WARNING naming a firing it sent in the two-phase window: its commit found it
taken over, or failed until its lease ran out (``beatless.node.dispatch``)."""


def code_version() -> str:
    """The commit of the beatless under test, ``+dirty`` if its package has changes."""
    git = ["git", "-C", str(CODE_ROOT)]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changes = subprocess.run(
            [*git, "status", "--porcelain", "--", "beatless"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"unknown ({CODE_ROOT})"
    return commit + ("+dirty" if changes else "")


def sleep_until(instant: float) -> None:
    """Sleep until the real clock reads ``instant`` (seconds since the epoch)."""
    while (left := instant - time.time()) > 0:
        time.sleep(min(left, 0.5))


def drawn_seed() -> int:
    """A random scenario's seed: ``BEATLESS_SEED`` if set (to run a failed seed again),
    else drawn. Printed, so that a failure can be run again."""
    seed = int(os.environ.get("BEATLESS_SEED") or random.randrange(2**32))
    print(f"seed {seed}")
    return seed


def next_whole_second(lead_s: float) -> int:
    """The first whole second at least ``lead_s`` from now: an anchor for the schedule."""
    return math.ceil(time.time() + lead_s)


class Fleet:
    """Node processes of one scenario, and the files they write under ``workdir``."""

    def __init__(self, workdir: Path, scenario: str, schedule: dict[str, Any]) -> None:
        self.workdir = workdir
        self.scenario = scenario
        self.schedule_spec = schedule
        self.processes: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []
        self.faults: list[Fault] = []
        self.started = 0.0
        workdir.mkdir(parents=True, exist_ok=True)

    def record_path(self, name: str) -> Path:
        return self.workdir / f"{name}.sends.jsonl"

    def summary_path(self, name: str) -> Path:
        return self.workdir / f"{name}.summary.json"

    def start(self, common: dict[str, Any], overrides: Sequence[dict[str, Any]]) -> None:
        """Start one node per item of ``overrides`` (each merged over ``common``); called
        again, more nodes (each of a new name)."""
        self.started = self.started or time.time()
        env = {**os.environ, "PYTHONPATH": str(CODE_ROOT)}
        for index, override in enumerate(overrides):
            name = override.get("node", f"n{index}")
            config = {
                "node": name,
                "schedule": self.schedule_spec,
                "record": str(self.record_path(name)),
                "summary": str(self.summary_path(name)),
                **common,
                **override,
            }
            path = self.workdir / f"{name}.config.json"
            path.write_text(json.dumps(config, indent=2))
            with self.log_path(name).open("ab") as log:
                process = subprocess.Popen(
                    [sys.executable, str(NODE_SCRIPT), str(path)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            self.processes.append(process)
            self.names.append(name)

    def pid(self, name: str) -> int:
        return self.processes[self.names.index(name)].pid

    def freeze(self, name: str) -> None:
        """SIGSTOP the node: it holds whatever it held, and does nothing."""
        os.kill(self.pid(name), signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        """SIGCONT the node."""
        os.kill(self.pid(name), signal.SIGCONT)

    def fault(self, name: str, start: float, end: float, nodes: Sequence[str] = ()) -> None:
        """Note that a fault was on from ``start`` to ``end`` (real clock, seconds), on the
        ``nodes`` it struck (none named: every node, a fault of the store or broker)."""
        self.faults.append(Fault(name, start, end, tuple(nodes)))

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def told_in_window(self) -> dict[str, set[str]]:
        """By node, the firings its log names as sent in the two-phase window
        (:data:`TOLD_IN_WINDOW`)."""
        return {
            name: set(TOLD_IN_WINDOW.findall(path.read_text(errors="replace")))
            if (path := self.log_path(name)).exists()
            else set()
            for name in self.names
        }

    def wait(self, timeout: float) -> None:
        """Wait for the nodes to end on their own (their ``duration_s``), then stop them."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(deadline - time.monotonic(), 0.1))
        self.stop()

    def stop(self) -> None:
        """SIGCONT and SIGTERM every node still alive, then SIGKILL what is left."""
        alive = [p for p in self.processes if p.poll() is None]
        for process in alive:
            for signum in (signal.SIGCONT, signal.SIGTERM):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in alive:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()

    def sends_of(self, name: str) -> list[dict[str, Any]]:
        """What one node has sent so far (read while it runs; its commit lines left out)."""
        path = self.record_path(name)
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        items = [json.loads(line) for line in lines if line.endswith("}")]
        return [item for item in items if "commit" not in item]

    def first_scheduling(self) -> float:
        """When the first node's scheduler had started (real clock, from the summaries):
        an occurrence from then on is no node's start-up catch-up. The run's start when no
        node wrote a summary (the report names the silent nodes)."""
        summaries = read_summaries(self.summary_path(n) for n in self.names)
        found = [float(s["scheduling"]) for s in summaries if "scheduling" in s]
        return min(found, default=self.started)

    def report(
        self,
        window_s: tuple[float, float],
        also_expected: Mapping[str, Firing] | None = None,
        *,
        told: bool = False,
    ) -> Report:
        """Count duplicates, misses, stale and early sends for occurrences in ``window_s``
        (and the firings ``also_expected`` by id); print the report and append it to the
        results file. With ``told``, a duplicate in flight at a fault whose first sender's
        commit returned counts as such only if that node's log names it
        (:func:`analysis.in_flight_at_fault`)."""
        sends, failed = read_records(self.record_path(n) for n in self.names)
        summaries = read_summaries(self.summary_path(n) for n in self.names)
        window_ms = (int(window_s[0] * 1_000), int(window_s[1] * 1_000))
        schedule = build_schedule(self.schedule_spec)
        report = analyse(
            self.scenario,
            schedule,
            window_ms=window_ms,
            sends=sends,
            failed_sends=failed,
            summaries=summaries,
            faults=self.faults,
            also_expected=also_expected,
            told=self.told_in_window() if told else None,
        )
        report.silent_nodes = [n for n in self.names if not self.summary_path(n).exists()]
        report.files = str(self.workdir)
        report.wall_s = round(time.time() - self.started, 1)
        record(report, code_version())
        print(report.details())
        return report
