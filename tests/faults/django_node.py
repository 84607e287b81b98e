"""The django-celery-beat bridge in a fault node: :class:`beatless.django.PollDuty` beside
the node's scheduler, on its claim store and namespace, reading the rows of the tests'
Django project (``tests/django_settings.py``), as ``beatless.django.start_bridge`` runs it
in a Celery worker.

``fault_node``'s config key ``django``:

``env``            the Django project's environment (``DJANGO_SETTINGS_MODULE``, the
                   database alias, schema and port the node reads the rows on)
``path``           the folder of the settings module
``database``       the Django alias of the rows
``hash_every_s``   seconds between full passes (``beatless_django_hash_every``)
``max_late_s``     the app's ``beatless_max_late``: every row's ``max_late``
``read_delay_s``   each read of rows takes this much longer (a slow database): a fault
                   that falls in a poll falls between its read and its publish
``polls``          a file that receives one JSON line when the duty has started
                   (``ready``), as each poll begins (``begin``) and as it ends (``end``,
                   with the revision it wrote, or ``failed``)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from beatless.live import Live
from beatless.node.scheduler import Scheduler
from beatless.stores.base import ClaimStore


def record_polls(bridge: Any, node: str, path: str) -> Callable[[dict[str, Any]], None]:
    """Make ``bridge.poll`` append a line to ``path`` as it begins and as it ends; the
    function that appends a line."""
    poll = bridge.poll
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(line: dict[str, Any]) -> None:
        os.write(fd, (json.dumps({"node": node, **line}) + "\n").encode())

    def recording(*, full: bool = False) -> Any:
        write({"begin": time.time(), "full": full})
        try:
            result = poll(full=full)
        except Exception as exc:
            write({"failed": time.time(), "error": f"{type(exc).__name__}: {exc}"[:300]})
            raise
        revision = result.revision.number if result and result.revision else None
        write({"end": time.time(), "revision": revision, "stale": bool(result and result.stale)})
        return result

    bridge.poll = recording
    return write


def start(config: dict[str, Any], scheduler: Scheduler, store: ClaimStore) -> Any:
    """Set Django up and start this node's poll duty (stop it with ``.stop()``)."""
    spec = config["django"]
    os.environ.update(spec["env"])
    sys.path.insert(0, spec["path"])
    import django

    django.setup()
    from django_project import AfterRead

    from beatless.celery._settings import CelerySettings
    from beatless.django import OWNER, Bridge, DjangoRows, PollDuty

    namespace = scheduler.schedule.namespace
    delay_s = float(spec.get("read_delay_s", 0))
    rows = AfterRead(DjangoRows(spec["database"]), lambda: time.sleep(delay_s))
    live = Live(
        store,
        namespace=namespace,
        code=[entry.name for entry in scheduler.schedule.entries],
        writer="django-celery-beat",
        host=config["node"],
        owner=OWNER,
    )
    settings = CelerySettings(
        store_url=config["store"],
        broker_url="",
        namespace=namespace,
        timezone="UTC",
        max_late=timedelta(seconds=spec["max_late_s"]),
    )
    bridge = Bridge(live, rows, settings)
    write = record_polls(bridge, config["node"], spec["polls"])
    preference = scheduler.preference
    duty = PollDuty(
        bridge,
        store,
        node=scheduler.node,
        namespace=namespace,
        view=lambda: preference.view if preference.enabled else None,
        clock=scheduler.clock,
        hash_every_s=int(spec["hash_every_s"]),
        close=rows.close,
    )
    duty.start()
    write({"ready": time.time()})
    return duty
