"""``celery -A proj inspect beatless``: ask each worker how its beatless scheduler is.

Registered with Celery's remote-control panel when :mod:`beatless.celery` is imported.
Each worker that runs the :class:`~beatless.celery._worker.BeatlessStep` answers with its
registry record (node, schedule fingerprint, tzdata, clock offset, last wake, counters)
and a ``health`` line: ``ok``, or what is wrong with its loop (not running, not woken for
more than 5 s). A worker started with ``--without-beatless`` or whose schedule has
problems says so instead.
"""

from __future__ import annotations

import json
from typing import Any

from celery.worker.control import inspect_command

from beatless.celery._worker import BeatlessStep
from beatless.node._view import NodeView


def _step(state: Any) -> BeatlessStep | None:
    worker = getattr(getattr(state, "consumer", None), "controller", None)
    for step in getattr(worker, "steps", ()):
        if isinstance(step, BeatlessStep):
            return step
    return None


@inspect_command(name="beatless")  # type: ignore[untyped-decorator]
def beatless_status(state: Any) -> dict[str, Any]:
    """This worker's beatless scheduler: its registry record and health."""
    step = _step(state)
    if step is None:
        return {"scheduling": False, "health": "no beatless scheduler on this worker"}
    scheduler: NodeView | None = step.scheduler
    if scheduler is None:
        problems = list(step.schedule_problems)
        health = "schedule refused: " + "; ".join(problems) if problems else "not started"
        return {"scheduling": False, "health": health}
    record = scheduler.board.node_record(scheduler.now_ms())
    answer: dict[str, Any] = json.loads(record.to_json())
    answer.update(scheduling=True, health=record.health() or "ok")
    if step.schedule_problems:  # entries left out, each for a problem of its own
        answer["schedule_problems"] = list(step.schedule_problems)
    return answer
