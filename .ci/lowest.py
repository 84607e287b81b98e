"""Print the lowest versions pyproject.toml allows, one ``name==version`` a line.

Usage: ``python .ci/lowest.py EXTRA... [--group GROUP:NAME...]``

Every requirement of the named extras, and of the project itself (but those for another
platform only, such as ``tzdata`` on Windows), must have a ``>=`` lower bound; it is
printed as ``==`` that bound, so CI installs exactly the versions the declared ranges
start at.
``--group test:cronsim`` adds the lower bound of one package of a dependency group.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)")


def pin(requirement: str) -> str:
    """``"kombu[redis]>=5.3.0"`` → ``"kombu[redis]==5.3.0"``; other forms are an error."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        raise SystemExit(f"{PYPROJECT.name}: {requirement!r} has no '>=' lower bound to test")
    name, extras, version = match.groups()
    return f"{name}{extras or ''}=={version}"


def main(args: list[str]) -> int:
    project = tomllib.loads(PYPROJECT.read_text())
    extras = project["project"]["optional-dependencies"]
    groups = project.get("dependency-groups", {})
    pins = [pin(r) for r in project["project"]["dependencies"] if "sys_platform" not in r]
    names = iter(args)
    for arg in names:
        if arg == "--group":
            group, _, package = next(names).partition(":")
            found = [r for r in groups[group] if isinstance(r, str) and _name(r) == package]
            if not found:
                raise SystemExit(f"dependency group {group!r} has no {package!r}")
            pins += [pin(r) for r in found]
        else:
            pins += [pin(r) for r in extras[arg]]
    print("\n".join(dict.fromkeys(pins)))
    return 0


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
