"""The node's scheduler under the ``dramatiq`` CLI: one supervised process per node.

The CLI collects the middleware ``forks`` in one worker process only and starts each
fork once, from its main process. It watches only its worker processes: a fork that dies
is neither restarted nor reported, and the workers go on. So the fork beatless registers
is a small supervisor. It forks the scheduler process; when that process dies it logs
the death at CRITICAL and starts a new one, after 1 s, doubling up to 60 s while deaths
come quickly. The node's workers are never touched. A configuration error (a bad
schedule, an actor that does not exist) stops the supervisor at once, loudly, instead;
the worker processes refuse such a schedule too, so the node does not start. With
``on_schedule_error="consume"`` the scheduler process runs the entries without a problem
of their own, naming each one left out; when no part of the schedule is usable it says
once that the node schedules nothing, and the supervisor ends quietly.

The scheduler process reads the broker and the modules from the command line, as a
worker process does, finds the :class:`~beatless.dramatiq.Beatless` middleware and runs
its loop. If the supervisor dies, the scheduler process notices its new parent and stops
within a second; if the CLI's main process dies, the supervisor does the same.

This module does not import :mod:`beatless.dramatiq._middleware` (which imports it for
``forks``): the middleware is found on the broker as the one whose fork is
:func:`run_scheduler`, and read through :class:`SchedulerMiddleware`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from beatless.core._logtext import shown
from beatless.errors import BeatlessError, ConfigError

if TYPE_CHECKING:
    from dramatiq import Broker

    from beatless.node._view import NodeView

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_CONSUME = 0, 1, 3, 4
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
STABLE_S = 60.0
"""A scheduler process that lived this long resets the back-off to its first step."""
POLL_S = 0.5
STOP_TIMEOUT_S = 10.0


class SchedulerMiddleware(Protocol):
    """What the scheduler process uses of the :class:`~beatless.dramatiq.Beatless`
    middleware it finds on the broker."""

    def start(self, broker: Broker) -> NodeView | None: ...

    def stop(self, timeout: float | None = 10) -> None: ...


def run_scheduler() -> int:
    """The middleware fork: supervise this node's scheduler process until stopped."""
    if not hasattr(os, "fork"):  # pragma: no cover - Windows: run it here, unsupervised
        return serve(os.getppid())
    return Supervisor().run()


@dataclass
class Deaths:
    """The deaths of this node's scheduler processes, told to the next one, which puts
    them in its registry record (``restarts``, ``last_failure``): a crash shows in
    ``beatless status``, not only in the log."""

    count: int = 0
    last: str | None = None
    last_ms: int | None = None


_deaths = Deaths()
"""Set by the supervisor before each fork; read by the scheduler process it forks."""


class Supervisor:
    """Starts the scheduler process, and a new one each time it dies."""

    def __init__(self) -> None:
        self.parent = os.getppid()
        self.child: int | None = None

    def run(self) -> int:
        backoff = FIRST_BACKOFF_S
        try:
            while True:
                started = time.monotonic()
                code = self._run_once()
                if code is None:
                    return EXIT_OK
                if code == EXIT_CONSUME:
                    logger.info("beatless supervisor: this node schedules nothing; stopping")
                    return code
                if code == EXIT_CONFIG:
                    logger.critical(
                        "beatless scheduler stopped on a configuration error (above); it is not "
                        "restarted and this node schedules nothing until it is fixed"
                    )
                    return code
                lived = time.monotonic() - started
                _deaths.count += 1
                _deaths.last = _describe_exit(code)
                _deaths.last_ms = int(time.time() * 1_000)
                if lived >= STABLE_S:
                    backoff = FIRST_BACKOFF_S
                logger.critical(
                    "beatless scheduler process died (%s) after %.1fs; this node's workers keep "
                    "working and other nodes keep claiming; restarting it in %.0fs",
                    _describe_exit(code),
                    lived,
                    backoff,
                )
                if not self._wait(backoff):
                    return EXIT_OK
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            self._stop_child()

    def _run_once(self) -> int | None:
        """Run one scheduler process to its end: its exit code, or ``None`` when the
        supervisor itself must stop (its parent is gone)."""
        pid = os.fork()
        if pid == 0:  # the scheduler process: never return into the supervisor's frames
            code = EXIT_FAILED
            try:
                code = serve(os.getppid())
            finally:
                logging.shutdown()
                os._exit(code)
        self.child = pid
        logger.info("beatless scheduler process %d started", pid)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.child = None
                return os.waitstatus_to_exitcode(status)
            if not self._wait(POLL_S):
                return None

    def _wait(self, seconds: float) -> bool:
        """Sleep; ``False`` when the parent (the CLI's main process) is gone."""
        time.sleep(seconds)
        return os.getppid() == self.parent

    def _stop_child(self) -> None:
        pid, self.child = self.child, None
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    return
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ChildProcessError, ProcessLookupError):
            return


def serve(parent: int) -> int:
    """The scheduler process: load the app, run the loop until SIGTERM or orphaned."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from dramatiq.middleware import MiddlewareError

    try:
        broker, middleware = load()
        scheduler = middleware.start(broker)
    except MiddlewareError:  # the node refused to start, and said why at CRITICAL
        return EXIT_CONFIG
    except (BeatlessError, ImportError):
        logger.exception("beatless scheduler cannot start")
        return EXIT_CONFIG
    except Exception:
        logger.exception("beatless scheduler failed to start")
        return EXIT_FAILED
    if scheduler is None:  # on_schedule_error="consume": said once, at ERROR
        broker.close()
        return EXIT_CONSUME
    scheduler.board.restarted(_deaths.count, _deaths.last, _deaths.last_ms)
    logger.info(
        "beatless scheduler process %d: node %s, %d entries",
        os.getpid(),
        shown(scheduler.node, quoted=False),
        len(scheduler.schedule.entries),
    )
    try:
        while not stop.wait(POLL_S):
            if os.getppid() != parent:
                logger.warning("beatless scheduler: the supervisor is gone; stopping")
                break
    finally:
        middleware.stop()
        broker.close()
    return EXIT_OK


def load() -> tuple[Broker, SchedulerMiddleware]:
    """The broker of this ``dramatiq`` command line and its Beatless middleware, with the
    command line's modules imported (so their actors are declared)."""
    from dramatiq import cli

    # Typed views of the CLI's own helpers, so the command line is read as it reads it.
    make_parser: Callable[[], argparse.ArgumentParser] = cli.make_argument_parser
    import_broker: Callable[[str], tuple[object, Broker]] = cli.import_broker
    try:
        args = make_parser().parse_args(sys.argv[1:])
    except SystemExit:
        raise ConfigError(
            f"beatless scheduler: cannot read the dramatiq command line {sys.argv!r}"
        ) from None
    for path in args.path:
        if path not in sys.path:
            sys.path.insert(0, path)
    _, broker = import_broker(args.broker)
    for module in args.modules:
        importlib.import_module(module)
    found = [m for m in broker.middleware if run_scheduler in m.forks]
    if len(found) != 1:
        raise ConfigError(
            f"beatless scheduler: the broker {args.broker!r} has {len(found)} Beatless "
            f"middleware; add exactly one"
        )
    return broker, cast("SchedulerMiddleware", found[0])


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
