"""The worker side of a firing, for Dramatiq: each beatless message checked before its actor.

Every worker thread checks a beatless message before its actor's body (the middleware's
``before_process_message``): the run policy the message carries
(:data:`~beatless.node.runs.RUN_HEADER`) is checked with :class:`~beatless.node.runs.Runs`
on the claim store the scheduler uses, opened once per worker process (the CLI's worker
processes are forks), waiting up to ``check_wait`` for a store it cannot reach, and a
refused run (``duplicate``, ``skipped_overlap``) raises
:class:`~dramatiq.middleware.SkipMessage`. A run that proceeds is ended when the message
is processed or skipped, whatever the result (``after_process_message``,
``after_skip_message``). A message without a run policy passes untouched.

:attr:`RunGate.counts` is what this process decided (``run``, ``rerun``, ``unchecked``,
``duplicate``, ``skipped_overlap``, ``lease_lost``, ``waited`` (checks that waited for the
store), and what became of the unchecked runs:
``recorded_late``, ``ran_twice``, ``unrecorded``, and of runs that ended cut off from
it: ``committed_late``, ``uncommitted``); each process logs its counts at INFO
when its worker stops.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from dramatiq.middleware import SkipMessage

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.dramatiq._messages import ADDRESS_OPTION, ENTRY_OPTION, TENANT_OPTION
from beatless.dramatiq._settings import DramatiqSettings
from beatless.node.runs import RUN_HEADER, Run, RunPolicy, Runs
from beatless.schedule.entry import address_segment, tenant_address
from beatless.stores.base import ClaimStore

if TYPE_CHECKING:
    from dramatiq import Broker
    from dramatiq.broker import MessageProxy

logger = logging.getLogger(__name__)


class RunGate:
    """The run checks of one middleware, in the process that runs them.

    ``store_of(broker)`` opens the claim store of this process's runs: the one the
    scheduler claims in. It is opened on first use, again in a forked process, and again
    after :meth:`close`; the node name of the runs is ``host:pid``.
    """

    def __init__(
        self, settings: DramatiqSettings, store_of: Callable[[Broker], ClaimStore]
    ) -> None:
        self.settings = settings
        self._store_of = store_of
        self._runs: Runs | None = None
        self._pid = 0
        self._closed = False
        self._running: dict[int, tuple[MessageProxy, Runs, Run]] = {}
        """The runs that proceeded, by the message proxy being processed (two copies of
        one message, same id, may be processed at once in one process)."""
        self._lock = threading.Lock()

    def check(self, broker: Broker, message: MessageProxy) -> None:
        """Check the run of a beatless firing before its actor's body.

        A message that carries a run policy (:data:`~beatless.node.runs.RUN_HEADER`) with
        anything to check is started with :meth:`Runs.start <beatless.node.runs.Runs.start>`
        (the attempt is the ``retries`` option of Dramatiq's ``Retries`` middleware); a
        refused run (``duplicate``, ``skipped_overlap``; counted and logged by
        :class:`~beatless.node.runs.Runs`) raises :class:`~dramatiq.middleware.SkipMessage`, so
        the message is acknowledged without running. Any other message passes."""
        policy = RunPolicy.decode(message.options.get(RUN_HEADER))
        if policy is None or not policy.guarded:
            return
        address = self.address_of(message)
        if address is None:
            logger.warning(
                "beatless: message %s carries a run policy but no address; run unchecked",
                shown(message.message_id),
            )
            return
        runs = self.runs(broker)
        run = runs.start(message.message_id, address, policy, _attempt(message))
        if not run.proceed:
            raise SkipMessage(f"beatless: firing {message.message_id} not run: {run.verdict}")
        with self._lock:
            self._running[id(message)] = (message, runs, run)

    def end(self, message: MessageProxy) -> None:
        """End the run of ``message``, if it proceeded: processed or skipped."""
        with self._lock:
            found = self._running.pop(id(message), None)
        if found is not None:
            _, runs, run = found
            runs.end(run)

    def runs(self, broker: Broker) -> Runs:
        """The run checks of this process, on the claim store the scheduler uses (opened
        on first use, again in a forked process, and again after :meth:`close`). Its node
        name is ``host:pid``."""
        pid = os.getpid()
        with self._lock:
            runs = self._runs
            if runs is None or self._pid != pid or self._closed:
                node = f"{self.settings.node or socket.gethostname()}:{pid}"
                fresh = Runs(
                    partial(self._store_of, broker),
                    node,
                    clock=self.settings.clock,
                    check_wait=self.settings.check_wait,
                )
                if runs is not None and self._pid == pid:
                    fresh.counts = runs.counts  # the process's counts go on
                else:
                    self._running = {}
                self._runs, self._pid, self._closed = fresh, pid, False
                runs = fresh
            return runs

    @property
    def counts(self) -> dict[str, int]:
        """The verdicts of this process's runs so far (see the module doc)."""
        runs = self._runs
        if runs is None or self._pid != os.getpid():
            return {}
        return dict(runs.counts)

    def close(self) -> None:
        """Stop this process's heartbeat thread and close the store of its runs (the
        counts are kept)."""
        with self._lock:
            runs, closed = self._runs, self._closed
            self._closed = True
            mine = self._pid == os.getpid()
        if runs is not None and mine and not closed:
            if runs.counts:
                said = ", ".join(f"{k}={v}" for k, v in sorted(runs.counts.items()))
                logger.info(
                    "beatless runs of node %s: %s",
                    shown(runs.node, quoted=False),
                    shown(said, quoted=False, limit=ERROR_LIMIT),
                )
            runs.close()

    def address_of(self, message: MessageProxy) -> str | None:
        """The message's address option; for a message without one, the address its
        entry and tenant options make in this middleware's namespace."""
        options = message.options
        address = options.get(ADDRESS_OPTION)
        if isinstance(address, str) and address:
            return address
        entry = options.get(ENTRY_OPTION)
        if not isinstance(entry, str) or not entry:
            return None
        base = f"{self.settings.address_namespace}/{address_segment(entry)}"
        tenant = options.get(TENANT_OPTION)
        return base if tenant is None else tenant_address(base, str(tenant))


def _attempt(message: MessageProxy) -> int:
    """The attempt of a message: how many times Dramatiq's ``Retries`` retried it."""
    retries = message.options.get("retries", 0)
    return retries if isinstance(retries, int) and retries >= 0 else 0
