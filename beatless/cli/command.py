"""The ``beatless`` command: its parser and :func:`main`, which hands each command to the
module of the cli package that runs it: ``next`` (:mod:`._next`), ``check``
(:mod:`._check`), ``explain`` (:mod:`._explain`), ``run`` (:mod:`._run`), ``status``
(:mod:`._status`), ``pause``, ``resume`` and ``run-now`` (:mod:`._controls`), ``demo``
(:mod:`.demo`).

Exit codes: 0 success; 1 when ``check`` finds problems or ``explain`` is asked about an
instant that is not an occurrence (or one the entry does not schedule); 2 for input
beatless cannot use (an unreadable file, an unknown key, a bad expression, a bad time)
and for a store that refuses the credentials or cannot be reached, always as one line
on stderr.
Environment variables (``BEATLESS_STORE``, ``BEATLESS_NODE``) are read in this package
only (:mod:`._run` and :mod:`._fleet`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from functools import partial
from typing import NoReturn

from beatless._version import __version__
from beatless.cli import _check, _controls, _explain, _next, _run, _status, schedule_command
from beatless.cli._common import EXIT_BAD_INPUT, EXIT_PROBLEMS
from beatless.cli._fleet import fleet_from_args
from beatless.errors import BeatlessError

__all__ = ["EXIT_BAD_INPUT", "EXIT_PROBLEMS", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915 - one statement per option
    parser = _Parser(
        prog="beatless",
        description="Periodic tasks with no beat process and no leader.",
    )
    parser.add_argument("--version", action="version", version=f"beatless {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    target_help = "a TOML schedule file, or module:attribute naming a Schedule or list of Entry"

    nxt = commands.add_parser("next", help="list the coming firings, sorted by release")
    nxt.add_argument("schedule", metavar="TARGET", nargs="?", help=f"{target_help} (as --schedule)")
    _fleet_source(nxt, target_help)
    nxt.add_argument("--entry", metavar="NAME", help="only this entry")
    nxt.add_argument(
        "--tenant", metavar="T", help="only this tenant of the fan-out entry --entry names"
    )
    nxt.add_argument(
        "--count",
        type=int,
        default=5,
        metavar="N",
        help="firings per entry (5); a fan-out entry's N released first, over all its tenants",
    )
    nxt.add_argument("--after", metavar="ISO", help="an ISO 8601 instant (default: now)")
    nxt.add_argument("--json", action="store_true", help="one JSON object per line")

    check = commands.add_parser("check", help="validate entries and timing rules")
    check.add_argument("target", metavar="TARGET", nargs="?", help=target_help)
    framework = check.add_mutually_exclusive_group()
    framework.add_argument(
        "--celery",
        metavar="APP",
        help="check a Celery app's beat_schedule and beatless settings, named as for "
        "celery -A (proj.celery:app, or proj.celery with an app attribute)",
    )
    framework.add_argument(
        "--dramatiq",
        nargs="+",
        metavar="BROKER",
        help="check the Beatless middleware of a Dramatiq broker, named as for the dramatiq "
        "command: BROKER [MODULE ...] (proj.broker:broker, or a module using the global "
        "broker, then the modules that declare actors)",
    )
    check.add_argument(
        "--store",
        metavar="URL",
        help="also connect to this store: probe it, check rule 5, measure the clock offset",
    )

    explain = commands.add_parser(
        "explain",
        help="derive a firing's id, offset and release; with a store, say what happened to it",
    )
    explain.add_argument(
        "schedule", metavar="TARGET", nargs="?", help=f"{target_help} (as --schedule)"
    )
    explain.add_argument("entry", metavar="ENTRY", help="the entry's name")
    _fleet_source(explain, target_help)
    explain.add_argument("--at", required=True, metavar="ISO", help="the occurrence")
    explain.add_argument("--tenant", metavar="T", help="the tenant, for a fan-out entry")

    run = commands.add_parser("run", help="run a standalone node with a logging enqueue")
    run.add_argument("target", metavar="TARGET", help=target_help)
    run.add_argument("--store", metavar="URL", help="claim store URL (env BEATLESS_STORE)")
    run.add_argument("--node", metavar="NAME", help="node name (env BEATLESS_NODE)")
    run.add_argument(
        "--every-node-claims",
        action="store_true",
        help="claim every firing on this node, instead of leaving each to the node of the "
        "registry preferred for it (more store work; for comparison and debugging)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs beatless[metrics])",
    )
    run.add_argument(
        "--metrics-host",
        metavar="ADDR",
        help="the address the metrics port listens on (127.0.0.1; 0.0.0.0 for every interface)",
    )

    schedule_command.add_parser(commands, _fleet_source)
    status = commands.add_parser(
        "status", help="what the fleet did and does, read from the claim store"
    )
    status.add_argument(
        "schedule", metavar="TARGET", nargs="?", help=f"{target_help} (as --schedule)"
    )
    _fleet_source(status, target_help)
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.add_argument(
        "--serve", type=int, metavar="PORT", help="serve a read-only status page on this port"
    )
    status.add_argument(
        "--host", default="127.0.0.1", help="the address the page listens on (127.0.0.1)"
    )
    status.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the page answers to besides localhost and IP addresses (repeatable)",
    )

    pause = commands.add_parser("pause", help="pause an entry on every node, through the store")
    _fleet_source(pause, target_help)
    pause.add_argument("entry", metavar="ENTRY", help="the entry's name")
    pause.add_argument(
        "--until", metavar="WHEN", help="an ISO 8601 instant or a duration (2h); default: resume"
    )
    resume = commands.add_parser("resume", help="resume a paused entry on every node")
    _fleet_source(resume, target_help)
    resume.add_argument("entry", metavar="ENTRY", help="the entry's name")
    run_now = commands.add_parser("run-now", help="one manual firing of an entry, sent once")
    _fleet_source(run_now, target_help)
    run_now.add_argument("entry", metavar="ENTRY", help="the entry's name")
    run_now.add_argument("--tenant", metavar="T", help="one tenant of a fan-out entry")

    demo = commands.add_parser("demo", help="race local nodes on a claim store (SQLite default)")
    demo.add_argument("--nodes", type=int, default=3, help="node processes (3)")
    demo.add_argument("--seconds", type=float, default=30.0, help="how long to run (30)")
    demo.add_argument("--json", action="store_true", help="JSON lines; summary last")
    demo.add_argument(
        "--store", metavar="URL", help="race on this claim store (default: a temporary SQLite file)"
    )
    return parser


def _fleet_source(parser: argparse.ArgumentParser, target_help: str) -> None:
    """The options that name a fleet's schedule, store and namespace, shared by every
    command that reads or steers a fleet (status, the controls, next, explain)."""
    parser.add_argument(
        "--schedule",
        dest="target",
        metavar="TARGET",
        help=f"{target_help} (its namespace and entries)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--celery", metavar="APP", help="take the store and namespace from a Celery app"
    )
    source.add_argument(
        "--dramatiq",
        nargs="+",
        metavar="BROKER",
        help="take the store and namespace from a Dramatiq broker's Beatless middleware",
    )
    parser.add_argument("--store", metavar="URL", help="claim store URL (env BEATLESS_STORE)")
    parser.add_argument(
        "--namespace",
        metavar="NS",
        help="the fleet's namespace (with --store alone: beatless_namespace of a Celery app, "
        "Beatless(namespace=...) of Dramatiq, a schedule's namespace)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # so module:attribute targets resolve like python -m
    handlers = {"next": _next.cmd_next, "check": _check.cmd_check, "explain": _explain.cmd_explain}
    handlers.update(run=_run.cmd_run, demo=cmd_demo, status=_status.cmd_status)
    handlers["schedule"] = partial(schedule_command.cmd_schedule, fleet_from_args)
    control = _controls.cmd_control
    handlers.update({"pause": control, "resume": control, "run-now": control})
    try:
        return handlers[args.command](args)
    except BeatlessError as exc:
        print(f"beatless {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away, as with `beatless next ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _one_line(exc: BeatlessError) -> str:
    return " ".join(str(exc).split())


def cmd_demo(args: argparse.Namespace) -> int:
    from beatless.cli.demo import run_demo

    return run_demo(nodes=args.nodes, seconds=args.seconds, as_json=args.json, store=args.store)
