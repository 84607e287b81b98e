"""``beatless pause``, ``resume`` and ``run-now``: steer an entry on every node through
the store."""

from __future__ import annotations

import argparse

from beatless.cli._fleet import fleet_from_args
from beatless.cli.loader import parse_instant
from beatless.core.durations import to_ms
from beatless.errors import ConfigError
from beatless.schedule.firing import from_datetime, iso


def cmd_control(args: argparse.Namespace) -> int:
    """``pause``, ``resume`` and ``run-now``: one control note and its audit record."""
    from beatless.fleet._controls import set_control
    from beatless.ops.status import known_entries

    fleet = fleet_from_args(args)
    namespace = fleet.namespace
    with fleet.open() as store:
        entries = known_entries(store, namespace, fleet.schedule)
        if args.entry not in entries:
            raise ConfigError(
                f"no entry named {args.entry!r} in namespace {namespace!r}"
                + (
                    f"; its entries: {', '.join(sorted(entries))}"
                    if entries
                    else " (no node has published its entries: give --schedule)"
                )
            )
        tenant = getattr(args, "tenant", None)
        tenants = entries[args.entry]
        if tenant is not None and tenants is not None and tenant not in tenants:
            raise ConfigError(f"entry {args.entry!r} has no tenant {tenant!r}")
        until_ms = _until_ms(args.until, store.time_ms()) if getattr(args, "until", None) else None
        control = set_control(
            store, namespace, args.command, args.entry, until_ms=until_ms, tenant=tenant
        )
    said = {
        "pause": "paused" + (f" until {iso(until_ms)}" if until_ms else " until resumed"),
        "resume": "resumed",
        "run-now": "queued for one manual firing" + (f" of tenant {tenant!r}" if tenant else ""),
    }[args.command]
    print(
        f"entry {args.entry!r} of namespace {namespace!r} {said} (by {control.by} on "
        f"{control.host} at {iso(control.at_ms)}); every node honours it within a second"
    )
    return 0


def _until_ms(text: str, now_ms: int) -> int:
    """``--until``: an ISO 8601 instant, or a duration from now; in the future."""
    from beatless.core.durations import as_timedelta

    try:
        until = now_ms + to_ms(as_timedelta(text, name="--until"))
    except ConfigError:
        until = from_datetime(parse_instant(text, what="--until"))
    if until <= now_ms:
        raise ConfigError(f"--until {text!r} is not in the future")
    return until
