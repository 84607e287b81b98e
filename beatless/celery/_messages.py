"""What a firing becomes as a Celery task message: the id, the headers, the options.

Shared by the two-phase path (``app.send_task``) and the atomic path (a message built
as kombu builds it and pushed by the claim script), so both send the same message.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from beatless.node.runs import RUN_HEADER, RunPolicy
from beatless.schedule.firing import Firing, iso, to_datetime

OCCURRENCE_HEADER = "beatless_occurrence"
"""The nominal occurrence of the firing, UTC ISO 8601: not the time the task runs."""
ADDRESS_HEADER = "beatless_address"
OFFSET_HEADER = "beatless_offset_ms"

SETTINGS_OPTION = "beatless"
"""The key of a ``beat_schedule`` entry's ``options`` that holds its beatless settings
(jitter, max_late, tenants, catch_up, overlap, run_lease, heartbeat, once_only). Stock
``celery beat`` passes it along as a harmless message property, so a schedule that
carries it still loads and runs there."""


def firing_headers(firing: Firing) -> dict[str, Any]:
    """The beatless headers of a firing's message: its occurrence, address and offset, and
    its entry's run policy (:data:`~beatless.node.runs.RUN_HEADER`), which a worker where
    :func:`~beatless.celery.install` was called checks before the task body runs."""
    return {
        OCCURRENCE_HEADER: iso(firing.occurrence_ms),
        ADDRESS_HEADER: firing.address,
        OFFSET_HEADER: firing.offset_ms,
        RUN_HEADER: run_header(firing),
    }


def run_header(firing: Firing) -> str:
    """The run policy of ``firing``'s entry, as its message carries it: the same for
    every firing of the entry."""
    return RunPolicy.of_entry(firing.entry).encode()


def send_task_options(firing: Firing, *, expires_from_lateness: bool = False) -> dict[str, Any]:
    """The keyword arguments of ``app.send_task`` for one firing.

    The task id is the firing id. The entry's ``options`` pass through as Celery beat
    passes them to ``apply_async`` (less the beatless settings); their ``headers`` are
    merged with the beatless headers. With ``expires_from_lateness``, a message that
    carries no ``expires`` of its own expires when the firing would be late
    (occurrence + jitter + max_late), so a firing delivered very late is not run.
    """
    entry = firing.entry
    options = {k: v for k, v in entry.options.items() if k != SETTINGS_OPTION}
    options["headers"] = {**dict(options.get("headers") or {}), **firing_headers(firing)}
    if expires_from_lateness and options.get("expires") is None:
        options["expires"] = to_datetime(firing.occurrence_ms) + entry.jitter + entry.max_late
    options["task_id"] = firing.id
    return options


# -- reading a task's request -----------------------------------------------------------


def occurrence(request: Any) -> datetime | None:
    """The nominal occurrence of the firing that sent this task, an aware UTC datetime.

    ``request`` is ``task.request`` (``self.request`` in a bound task). With a jitter
    window the task runs after its occurrence, by the firing's offset and the queue's
    delay: use this, not the clock, for the period a run is about. ``None`` for a task
    that no beatless firing sent.
    """
    value = _header(request, OCCURRENCE_HEADER)
    if value is None:
        return None
    return datetime.fromisoformat(str(value))


def task_firing_id(request: Any) -> str | None:
    """The id of the firing that sent this task: its task id, the same on every node.

    A consumer that must not run a firing twice keys its deduplication on it."""
    if _header(request, OCCURRENCE_HEADER) is None:
        return None
    value = getattr(request, "id", None)
    return None if value is None else str(value)


def tenant(request: Any) -> str | None:
    """The tenant of a fan-out firing (the last part of its address), else ``None``."""
    address = _header(request, ADDRESS_HEADER)
    if address is None:
        return None
    parts = str(address).split("/", 2)
    return parts[2] if len(parts) == 3 else None


def _header(request: Any, name: str) -> Any:
    """A custom message header: an attribute of a worker's request (protocol 2), or an
    item of ``request.headers`` (``task.apply(headers=...)`` and eager calls)."""
    value = getattr(request, name, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(name) if isinstance(headers, dict) else None
    return value
