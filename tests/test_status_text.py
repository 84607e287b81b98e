"""``beatless status`` as text: a name read from the store never writes a line of its own
nor drives the terminal, whatever it holds."""

from __future__ import annotations

from stores import ManualClock

from beatless import Entry, Every, Schedule
from beatless.fleet._controls import set_control
from beatless.node.scheduler import Scheduler
from beatless.ops.status import render, report
from beatless.stores import MemoryStore

FORGED = "\n  forged  every 1s\r\x1b[31m\x1b[2K"
"""What a name would add to the text if written as it is: a line, a carriage return that
rewrites the line, and ANSI escapes that recolour and erase it."""


def _fleet_text(suffix: str) -> str:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    entry = Entry(name=f"tick{suffix}", task="tasks.t", trigger=Every(1), tenants=[f"t{suffix}"])
    schedule = Schedule([entry], namespace="text")
    nodes = [
        Scheduler(schedule, store=store, clock=clock, node=f"n{i}{suffix}", lease="2s")
        for i in range(2)
    ]
    for _ in range(12):
        for node in nodes:
            node.tick()
            node.board.sync()
        clock.advance(250)
    set_control(store, "text", "pause", entry.name)
    set_control(store, "text", "run-now", entry.name, tenant=f"t{suffix}")
    return render(report(store, "text", schedule=schedule, now_ms=clock.now_ms()))


def test_names_and_tenants_with_line_breaks_and_escapes_stay_on_their_line() -> None:
    text = _fleet_text(FORGED)
    plain = _fleet_text("")

    assert "\r" not in text
    assert "\x1b" not in text
    assert not any(line.lstrip().startswith("forged") for line in text.splitlines())
    assert len(text.splitlines()) == len(plain.splitlines())
    assert "tick\\n  forged  every 1s\\r\\x1b[31m\\x1b[2K" in text  # shown, escaped
    assert "tenant t\\n" in text
    assert "n0\\n" in text
    assert "n1\\n" in text
