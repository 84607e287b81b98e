"""A ``fault_node`` that sends real Celery messages: the node of the copies scenarios.

Usage: python tests/faults/copies_node.py CONFIG.json

The same node as ``fault_node`` (its configuration, record and summary), but each won
firing is sent with beatless's own two-phase Celery sender
(``beatless.celery._sending.Sender``: ``app.send_task``, the firing id as the task id,
the beatless headers with the entry's run policy) to the queue of ``copies_app`` on the
Redis at ``celery_broker``, where real workers run it. Each send is recorded as
``fault_node`` records it, ``called`` and ``sent`` on the real clock.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import fault_node
from copies_app import sending_app

from beatless import Firing
from beatless.celery._sending import Sender
from beatless.node.dispatch import send_deadline_s


def make_enqueue(config: dict[str, Any], record_fd: int) -> Callable[[Firing], None]:
    """Wait the send delay, send the firing's Celery message, record the send."""
    delay = float(config.get("send_delay_s", 0))
    lease_ms = int(float(config.get("lease_s", 30)) * 1_000)
    sender = Sender(sending_app(config["celery_broker"]), deadline_s=send_deadline_s(lease_ms))
    node = config["node"]
    checked = fault_node.CheckedAt()
    checked.install()

    def enqueue(firing: Firing) -> None:
        called = checked.pop(firing.id) or time.time()
        if delay:
            time.sleep(delay)
        line: dict[str, Any] = {
            "id": firing.id,
            "address": firing.address,
            "entry": firing.entry.name,
            "occurrence_ms": firing.occurrence_ms,
            "release_ms": firing.release_ms,
            "max_late_ms": firing.entry.max_late_ms,
            "node": node,
            "called": called,
        }
        try:
            sender(firing)
        except Exception as exc:
            line["error"] = f"{type(exc).__name__}: {exc}"
            raise
        else:
            line["sent"] = time.time()
        finally:
            os.write(record_fd, (json.dumps(line) + "\n").encode())

    return enqueue


if __name__ == "__main__":
    fault_node.make_enqueue = make_enqueue  # the node's scheduler sends through it
    fault_node.main(sys.argv)
