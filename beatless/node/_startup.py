"""What a node checks and says as it starts: the schedule's timings against the store
(refused before the loop runs), what a fault would cost with this store, the entries no
takeover can save, whether live entries are read, and the entries the preferred
claimer's ladder leaves to every node."""

from __future__ import annotations

import logging

from beatless.core._logtext import shown
from beatless.errors import ScheduleError, StoreRefused
from beatless.fleet.limits import limits
from beatless.node._prefer import LADDER_MS
from beatless.node._wake import RETRY_MS
from beatless.node.dispatch import Dispatcher, TwoPhase
from beatless.schedule.entry import Schedule
from beatless.stores.base import ClaimStore, Verdict

logger = logging.getLogger("beatless.node.scheduler")
"""The scheduler's logger: these lines have always come from it."""


def check_store(schedule: Schedule, dispatcher: Dispatcher, lease_ms: int) -> None:
    """Refuse a schedule whose timings the store cannot keep, or a store whose settings
    are refused; say once, at INFO, what a fault would cost."""
    store = dispatcher.store
    errors = limits(schedule) + schedule.check_store(
        store.remembers,
        store.name,
        run_leases=store.holds_run_leases,
        lengthen=store.lengthen_memory,
    )
    if errors:
        raise ScheduleError("; ".join(errors), errors)
    facts = store.watch()  # read again at every sync (beatless.node._board)
    if store.refusal is not None:
        raise StoreRefused(store.refusal)
    # What a fault would cost is said once per start, at INFO: a Redis kept without
    # persistence on purpose must not be a WARNING at every worker's start. The
    # verdict stays in the registry record, `status` and `check --store`.
    for fact in facts.facts:
        if fact.verdict is not Verdict.OK:
            logger.info(
                "%s: %s %s: %s",
                shown(facts.store, quoted=False),
                shown(fact.name, quoted=False),
                fact.value,
                fact.why,
            )
    if isinstance(dispatcher, TwoPhase):
        _warn_no_takeover(schedule, lease_ms)


def _warn_no_takeover(schedule: Schedule, lease_ms: int) -> None:
    """Two-phase: a winner that dies before commit is replaced when its lease runs out,
    but only while the firing is not late. Say so for entries where it never is."""
    for entry in schedule.entries:
        if entry.jitter_ms + lease_ms + RETRY_MS >= entry.max_late_ms:
            logger.warning(
                "entry %s: jitter %dms + lease %dms leave no time within max_late %dms to "
                "take over a firing whose winner died before commit; shorten the lease "
                "or raise max_late",
                shown(entry.name),
                entry.jitter_ms,
                lease_ms,
                entry.max_late_ms,
            )


def live_enabled(live: bool, store: ClaimStore) -> bool:
    """Whether the node reads live entries: asked, and the store keeps notes (one INFO
    line when it cannot: the node runs its code entries only)."""
    if live and not store.keeps_notes:
        logger.info(
            "live entries off: the %s store cannot keep them (%s); this node runs its code "
            "entries only",
            shown(store.name, quoted=False),
            shown(store.why_not_kept, quoted=False),
        )
    return live and store.keeps_notes


def say_ladder(ladder: dict[str, bool]) -> None:
    """Name the entries every node claims, since the preferred claimer's ladder does not
    fit within their max_late."""
    every = [name for name, fit in ladder.items() if not fit]
    if every:
        logger.info(
            "%d entries claimed by every node, not by a preferred one: their jitter + "
            "%dms (the preferred claimer's ladder) exceed their max_late: %s",
            len(every),
            LADDER_MS,
            ", ".join(shown(name) for name in every[:10]) + (", ..." * (len(every) > 10)),
        )
