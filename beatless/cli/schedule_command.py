"""``beatless schedule``: read and change a fleet's live entries (:mod:`beatless.live`).

``list | get NAME | put FILE.toml | delete NAME | plan FILE.toml | apply FILE.toml |
history [NAME] | revert --to R | export | import --from redbeat://HOST:PORT/DB``, the
fleet named as for ``status`` (``--store`` with ``--namespace``, ``--celery``,
``--dramatiq``), ``--json`` everywhere. A TOML file is
read as a schedule file (``[[entry]]`` tables); ``put`` writes its entries, ``plan`` and
``apply`` make the live entries equal to them. ``export`` writes the live entries as a
TOML schedule file that ``put`` and the code's loader read back (``--format toml``, the
default) or as JSON (``--format json``, or ``--json``), for backups and for promoting an
entry to code. ``import`` reads RedBeat's entries from its Redis
(:mod:`beatless.celery._redbeat`) and adds them as one revision, the other live entries
left as they are; ``--dry-run`` prints the plan and writes nothing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from beatless.cli._toml import schedule_toml
from beatless.live import Live, Revision, entry_to_json
from beatless.live.plan import Plan

ACTIONS = (
    "list",
    "get",
    "put",
    "delete",
    "plan",
    "apply",
    "history",
    "revert",
    "export",
    "import",
)


def add_parser(commands: Any, fleet_source: Callable[[argparse.ArgumentParser, str], None]) -> None:
    """Add ``schedule`` to the command's sub-parsers; ``fleet_source`` adds the options
    that name a fleet, as ``status`` has them."""
    schedule = commands.add_parser("schedule", help="read and change the live entries in the store")
    schedule.add_argument("action", choices=ACTIONS)
    schedule.add_argument(
        "operand", nargs="?", metavar="NAME|FILE", help="an entry's name or a TOML file"
    )
    fleet_source(schedule, "a TOML schedule file, or module:attribute (the code entries)")
    schedule.add_argument("--json", action="store_true", help="JSON output")
    schedule.add_argument("--to", type=int, metavar="R", help="revert: the revision to go back to")
    schedule.add_argument("--note", help="a note kept with the revision")
    schedule.add_argument("--if-revision", type=int, metavar="R", help="refuse unless R is current")
    schedule.add_argument("--override", action="store_true", help="write names the code owns")
    schedule.add_argument(
        "--effective-in", metavar="DURATION", help="the fence after the commit (2s)"
    )
    schedule.add_argument("--window", default="7d", help="plan: the window from the fence (7d)")
    schedule.add_argument(
        "--format",
        choices=("toml", "json"),
        help="export: a TOML schedule file (the default) or JSON (the default with --json)",
    )
    _import_options(schedule)


def _import_options(schedule: argparse.ArgumentParser) -> None:
    schedule.add_argument(
        "--from",
        dest="from_url",
        metavar="URL",
        help="import: RedBeat's Redis, redbeat://HOST:PORT/DB (redbeats:// for TLS)",
    )
    schedule.add_argument(
        "--prefix", help="import: RedBeat's redbeat_key_prefix (the app's, else redbeat:)"
    )
    schedule.add_argument(
        "--timezone",
        metavar="ZONE",
        help="import: the zone of RedBeat's crontabs (default: the Celery app's timezone)",
    )
    schedule.add_argument(
        "--dry-run", action="store_true", help="import: print the plan, write nothing"
    )
    schedule.add_argument(
        "--skip-bad",
        action="store_true",
        help="import: leave out the entries that cannot be read (default: refuse the import)",
    )


def cmd_schedule(
    fleet_from_args: Callable[[argparse.Namespace], Any], args: argparse.Namespace
) -> int:
    """Run one action on the fleet ``fleet_from_args`` names."""
    from beatless.errors import ConfigError

    fleet = fleet_from_args(args)
    code = fleet.schedule.entries if fleet.schedule is not None else ()
    with fleet.open() as store:
        live = Live(store, namespace=fleet.namespace, code=code, timezone=_zone(fleet))
        needs = {"get": "NAME", "delete": "NAME", "put": "FILE", "plan": "FILE", "apply": "FILE"}
        if args.action in needs and not args.operand:
            raise ConfigError(f"schedule {args.action}: give {needs[args.action]}")
        if args.action == "import":
            result = _import(fleet, live, args)
        else:
            result = _ACTIONS[args.action](live, args)
    _print(result, args.json)
    return 0


def _zone(fleet: Any) -> str:
    return str(getattr(fleet.schedule, "timezone", None) or "UTC")


def _entries(path: str) -> list[Any]:
    from beatless.cli.loader import load_toml

    return list(load_toml(Path(path)).entries)


def _how(args: argparse.Namespace) -> dict[str, Any]:
    return {"note": args.note, "if_revision": args.if_revision, "effective_in": args.effective_in}


def _list(live: Live, _args: argparse.Namespace) -> Any:
    return {"revision": live.head(), "entries": [entry_to_json(e) for e in live.list()]}


def _get(live: Live, args: argparse.Namespace) -> Any:
    from beatless.errors import ConfigError

    entry = live.get(args.operand)
    if entry is None:
        raise ConfigError(f"no live entry {args.operand!r} in namespace {live.namespace!r}")
    return entry_to_json(entry)


def _put(live: Live, args: argparse.Namespace) -> Any:
    return live.put_many(_entries(args.operand), override=args.override, **_how(args))


def _delete(live: Live, args: argparse.Namespace) -> Any:
    return live.delete(args.operand, **_how(args))


def _plan(live: Live, args: argparse.Namespace) -> Any:
    return live.plan(
        _entries(args.operand), args.window, effective_in=args.effective_in, override=args.override
    )


def _apply(live: Live, args: argparse.Namespace) -> Any:
    plan = _plan(live, args)
    return live.apply(plan, note=args.note) or {"revision": live.head(), "changed": False}


def _history(live: Live, args: argparse.Namespace) -> Any:
    return live.history(args.operand)


def _revert(live: Live, args: argparse.Namespace) -> Any:
    from beatless.errors import ConfigError

    if args.to is None:
        raise ConfigError("schedule revert: give --to R")
    return live.revert(args.to, **_how(args))


def _export(live: Live, args: argparse.Namespace) -> Any:
    head, entries = live.head(), live.list()
    if (args.format or ("json" if args.json else "toml")) == "toml":
        return schedule_toml(
            entries,
            namespace=live.namespace,
            timezone=live.timezone,
            header=f"live entries of namespace {live.namespace!r} at revision {head}, "
            f"exported {_when(live.store.time_ms())}",
        )
    return {
        "namespace": live.namespace,
        "revision": head,
        "entries": [entry_to_json(e) for e in entries],
    }


def _import(fleet: Any, live: Live, args: argparse.Namespace) -> Any:
    """RedBeat's entries into the live entries, as one revision (``--dry-run``: the plan)."""
    from beatless.celery._redbeat import app_prefix, import_into, read_redbeat, with_zone
    from beatless.celery._settings import CelerySettings
    from beatless.core.triggers import zone as check_zone
    from beatless.errors import ConfigError

    if not args.from_url:
        raise ConfigError("schedule import: give --from redbeat://HOST:PORT/DB")
    zone = args.timezone or getattr(fleet.schedule, "timezone", None)
    if args.timezone:
        check_zone(args.timezone)
    if fleet.app is not None:
        settings = with_zone(CelerySettings.from_app(fleet.app), args.timezone)
    else:
        settings = CelerySettings(
            store_url="memory://",
            broker_url="memory://",
            namespace=fleet.namespace,
            timezone=zone or "UTC",
        )
    prefix = args.prefix or (app_prefix(fleet.app) if fleet.app is not None else None)
    read = read_redbeat(
        args.from_url,
        settings,
        prefix=prefix or "redbeat:",
        code=live.code,
        skip_bad=args.skip_bad,
        zone_known=fleet.app is not None or zone is not None,
    )
    done = import_into(
        live,
        read,
        dry_run=args.dry_run,
        note=args.note,
        window=args.window,
        effective_in=args.effective_in,
    )
    return done.to_json() if args.json else _import_text(done, args.dry_run)


def _import_text(done: Any, dry_run: bool) -> str:
    read = done.read
    lines = [f"RedBeat {read.url}, prefix {read.prefix!r}: {len(read.entries)} entries read"]
    if read.statics:
        lines.append(f"  left to the code (statics, code-owned): {', '.join(read.statics)}")
    lines += [f"  skipped {name}: {why}" for name, why in read.skipped]
    lines.append(_plan_text(done.plan))
    if done.revision is not None:
        lines.append(_revision_line(done.revision))
    elif dry_run:
        lines.append("dry run: nothing written")
    return "\n".join(lines) + "\n"


_ACTIONS: dict[str, Callable[[Live, argparse.Namespace], Any]] = {
    "list": _list,
    "get": _get,
    "put": _put,
    "delete": _delete,
    "plan": _plan,
    "apply": _apply,
    "history": _history,
    "revert": _revert,
    "export": _export,
}


def _print(result: Any, as_json: bool) -> None:
    if isinstance(result, str):  # a file's text, as it is
        print(result, end="")
        return
    data = _plain(result)
    if as_json or not isinstance(result, Revision | Plan | list):
        print(json.dumps(data, indent=2, ensure_ascii=False))
    elif isinstance(result, Revision):
        print(_revision_line(result))
    elif isinstance(result, Plan):
        print(_plan_text(result))
    else:
        for revision in result:
            print(_revision_line(revision))


def _plain(result: Any) -> Any:
    if isinstance(result, Revision | Plan):
        return result.to_json()
    if isinstance(result, list):
        return [_plain(item) for item in result]
    return result


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1_000, UTC).isoformat(timespec="milliseconds")


def _revision_line(revision: Revision) -> str:
    names = ", ".join(("-" if c.is_delete else "+") + c.name for c in revision.changes)
    note = f"  {revision.note}" if revision.note else ""
    return (
        f"r{revision.number}  {_when(revision.committed_ms)}  fence {_when(revision.fence_ms)}  "
        f"{revision.writer}@{revision.host}  {revision.hash[:12]}  {names}{note}"
    )


def _plan_text(plan: Plan) -> str:
    lines = [
        f"plan against r{plan.base_revision}, fence {_when(plan.fence_ms)}, to {_when(plan.end_ms)}"
    ]
    lines += [("  - " if c.is_delete else "  + ") + c.name for c in plan.changes]
    lines += [f"  adds {n} at {_when(o)}" for n, o in plan.added]
    lines += [f"  removes {n} at {_when(o)}" for n, o in plan.removed]
    lines += [f"  moves {n} {_when(a)} -> {_when(b)}" for n, a, b in plan.moved]
    lines += [
        f"  changes {n} (same firings, new task/args/options at the fence)" for n in plan.changed
    ]
    lines += [
        f"  straddles {n} at {_when(o)}, released {_when(r)}: old definition"
        for n, o, r in plan.straddling
    ]
    lines += [f"  dst {n}: {note.text()}" for n, note in plan.dst]
    return "\n".join(lines) if plan.changes else f"no change (r{plan.base_revision})"
