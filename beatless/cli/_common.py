"""What the commands share: exit codes, a plain-text table, instants and the tenant a
command names."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from beatless.cli.loader import parse_instant
from beatless.errors import ConfigError
from beatless.schedule.entry import Entry
from beatless.schedule.firing import from_datetime

EXIT_PROBLEMS = 1
EXIT_BAD_INPUT = 2


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print ``rows`` under ``header`` in columns as wide as their widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = (
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
    sys.stdout.write("".join(f"{line}\n" for line in lines))  # one write for many rows


def tenant_of(entry: Entry, tenant: str | None) -> str | None:
    """The tenant ``--tenant`` names: one of a fan-out entry's, None for an entry without."""
    tenants = entry.tenant_list()
    if tenants is None:
        if tenant is not None:
            raise ConfigError(f"entry {entry.name!r} has no tenants; drop --tenant")
        return None
    if tenant is None or tenant not in tenants:
        shown = ", ".join(tenants[:5]) + (", …" if len(tenants) > 5 else "")
        what = "pass --tenant" if tenant is None else f"{tenant!r} is not one of them"
        raise ConfigError(
            f"entry {entry.name!r} fans out to {len(tenants)} tenants ({shown}); {what}"
        )
    return tenant


def instant_ms(text: str, what: str) -> int:
    """The ISO 8601 instant an option (``what``) gives, in epoch milliseconds."""
    return from_datetime(parse_instant(text, what=what))


def now_ms() -> int:
    return from_datetime(datetime.now(UTC))
