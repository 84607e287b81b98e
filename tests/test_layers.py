"""The package's modules import one another one way: no import cycle, and no import
against the layers (:data:`LAYERS`, described in ``docs/architecture.md``).

An import made inside a function or under ``TYPE_CHECKING`` ties two modules together as
much as one at the top (it only runs later, or only for the type checker), so every
``import`` statement anywhere in a module counts, relative ones resolved. An import of
``beatless`` itself counts as an import of the package root (``beatless/__init__.py``),
which imports the public names: no module of the package may import it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "beatless"
TOOL = Path(__file__).resolve().parents[2] / "shared/tools/import_cycles.py"
"""The same count as a script, kept beside the project (not part of it)."""


def modules(root: Path) -> dict[str, Path]:
    """The modules of the package at ``root``, by dotted name (a package by its own)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _targets(
    name: str, path: Path, node: ast.Import | ast.ImportFrom, known: Mapping[str, Path]
) -> list[str]:
    """The modules one import statement names: ``from a import b`` names ``a.b`` when that is
    a module, ``a`` otherwise."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = name.split(".")
        keep = len(base) - node.level + (1 if path.name == "__init__.py" else 0)
        prefix = ".".join(base[:keep] + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [
        f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix
        for alias in node.names
    ]


def import_graph(root: Path) -> dict[str, set[str]]:
    """For each module of the package at ``root``, the modules of the package it imports,
    wherever the import is in it."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for named in _targets(name, path, node, known):
                target = named
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each group of modules that import one another,
    directly or not (its strongly connected components of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def described(found: Sequence[Sequence[str]], graph: Mapping[str, set[str]]) -> str:
    """The cycles as the failure says them: the modules, then each import that ties them."""
    lines = []
    for group in found:
        lines.append("cycle: " + ", ".join(group))
        lines.extend(f"  {a} -> {b}" for a in group for b in sorted(graph[a]) if b in group)
    return "\n".join(lines)


def test_no_module_of_the_package_imports_one_that_imports_it_back() -> None:
    graph = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, (
        "import cycles in beatless (imports inside functions and under TYPE_CHECKING "
        "count): move what both sides need into a module below them both, or give the "
        "lower side a Protocol of what it reads\n" + described(found, graph)
    )


def test_the_package_root_is_imported_by_no_module_of_the_package() -> None:
    graph = import_graph(PACKAGE)
    importers = sorted(name for name, targets in graph.items() if "beatless" in targets)
    assert importers == [], f"these import the package root: {importers}"


LAYERS: tuple[tuple[str, ...], ...] = (
    ("beatless.errors", "beatless._version"),
    ("beatless.core",),
    ("beatless.stores",),
    ("beatless.schedule",),
    ("beatless.fleet",),
    ("beatless.live",),
    ("beatless.node",),
    ("beatless.ops",),
    ("beatless.celery", "beatless.dramatiq"),
    ("beatless.django",),
    ("beatless.cli",),
)
"""The layers of the package, lowest first, each a tuple of packages (or modules). A
module imports only from its own package and from the layers below its own: never up,
and never across to another package of its own layer (Celery and Dramatiq never import
each other). Everything else is on top (:func:`top`) and imported by no module of the
package."""

COMPAT = "beatless._moved"
"""What the old module paths use to say they moved; only they import it."""


def old_paths(root: Path = PACKAGE) -> set[str]:
    """The old module paths kept one release: modules that say first that they moved."""
    return {m for m, path in modules(root).items() if path.read_text().startswith('"""Moved to ')}


def top(root: Path = PACKAGE) -> set[str]:
    """The modules above the layers: the package root, ``python -m beatless``, the old
    paths and their helper."""
    return {"beatless", "beatless.__main__", COMPAT} | old_paths(root)


def layer_of(module: str, layers: Sequence[Sequence[str]] = LAYERS) -> tuple[int, str] | None:
    """The rank and package of ``module`` in ``layers``, None when it is above them all."""
    for rank, packages in enumerate(layers):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return rank, package
    return None


def against_the_layers(
    graph: Mapping[str, set[str]],
    layers: Sequence[Sequence[str]] = LAYERS,
    above: Set[str] = frozenset(),
) -> list[str]:
    """Each import of ``graph`` that goes up a layer, across a layer, or into the top
    (modules outside ``layers`` and those ``above``)."""
    found = []
    for module in sorted(graph):
        here = None if module in above else layer_of(module, layers)
        for target in sorted(graph[module]):
            there = None if target in above else layer_of(target, layers)
            if here is None:
                continue  # the top may import anything
            if there is None:
                found.append(f"{module} -> {target}: into the top (the root or an old path)")
            elif there[0] > here[0]:
                found.append(f"{module} -> {target}: up from {here[1]} to {there[1]}")
            elif there[0] == here[0] and there[1] != here[1]:
                found.append(f"{module} -> {target}: across from {here[1]} to {there[1]}")
    return found


def test_every_import_goes_down_the_layers() -> None:
    found = against_the_layers(import_graph(PACKAGE), above=top())
    assert not found, (
        "imports against the layers (see LAYERS and docs/architecture.md): move what is "
        "needed down, or hand it in from above\n" + "\n".join(found)
    )


def test_every_module_of_the_package_has_its_layer_or_is_an_old_path() -> None:
    """A new module is put in a layer, not left on top by accident: the top holds only
    the root, the old paths (one release) and their helper."""
    unlayered = {m for m in modules(PACKAGE) if layer_of(m) is None}
    assert sorted(unlayered - old_paths()) == ["beatless", "beatless.__main__", COMPAT]


SYNTHETIC = {
    "__init__.py": "from pkg.e import E\n",
    # A cycle closed by an import inside a function, written relative.
    "a.py": "def late():\n    from . import b\n    return b\n",
    "b.py": "from pkg import a\n",
    # A cycle closed by an import only the type checker runs.
    "c.py": (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.sub.d import D\n"
    ),
    "sub/__init__.py": "",
    "sub/d.py": "from ..c import *\n\nclass D: ...\n",
    # The package root imported from inside.
    "e.py": "import pkg\n\nclass E: ...\n",
    # No cycle: imports one way only.
    "f.py": "import pkg.a\nfrom pkg.sub import d\n",
}


def synthetic_package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    for name, text in SYNTHETIC.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_cycle_test_finds_cycles_closed_in_a_function_under_type_checking_or_by_the_root(
    tmp_path: Path,
) -> None:
    graph = import_graph(synthetic_package(tmp_path))
    assert cycles(graph) == [["pkg", "pkg.e"], ["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"]]
    assert described(cycles(graph), graph).splitlines() == [
        "cycle: pkg, pkg.e",
        "  pkg -> pkg.e",
        "  pkg.e -> pkg",
        "cycle: pkg.a, pkg.b",
        "  pkg.a -> pkg.b",
        "  pkg.b -> pkg.a",
        "cycle: pkg.c, pkg.sub.d",
        "  pkg.c -> pkg.sub.d",
        "  pkg.sub.d -> pkg.c",
    ]


LAYERED = {
    "__init__.py": "",
    "low/__init__.py": "",
    "low/a.py": "",
    "mid/__init__.py": "",
    "mid/b.py": "from pkg.low import a\n",
    "mid/c.py": "def late():\n    from pkg.high import d\n",  # up, inside a function
    "high/__init__.py": "",
    "high/d.py": "from pkg.mid import b\nfrom pkg import top\n",  # down; into the top
    "side/__init__.py": "",
    "side/e.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.high import d\n",
    "top.py": "from pkg.high import d\n",
}
LAYERED_RANKS = (("pkg.low",), ("pkg.mid",), ("pkg.high", "pkg.side"))


def test_the_layer_test_finds_imports_up_across_and_into_the_top(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    for name, text in LAYERED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert against_the_layers(import_graph(root), LAYERED_RANKS) == [
        "pkg.high.d -> pkg.top: into the top (the root or an old path)",
        "pkg.mid.c -> pkg.high.d: up from pkg.mid to pkg.high",
        "pkg.side.e -> pkg.high.d: across from pkg.side to pkg.high",
    ]
    assert against_the_layers(import_graph(PACKAGE), above=top()) == []


def _tool_cycles(root: Path) -> list[list[str]]:
    """The cycles the shared script prints for the package at ``root``."""
    done = subprocess.run(
        [sys.executable, str(TOOL), root.name],
        check=False,
        cwd=root.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return sorted(
        sorted(line.removeprefix("cycle: ").split(", "))
        for line in done.stdout.splitlines()
        if line.startswith("cycle: ")
    )


def test_the_cycle_test_agrees_with_the_import_cycles_script(tmp_path: Path) -> None:
    if not TOOL.exists():
        pytest.skip(f"{TOOL} is not here (it is kept outside the project): nothing to compare")
    assert _tool_cycles(PACKAGE) == cycles(import_graph(PACKAGE))
    synthetic = synthetic_package(tmp_path)
    assert _tool_cycles(synthetic) == cycles(import_graph(synthetic)) != []


def _fresh(code: str) -> Any:
    """What ``code`` prints as JSON, run in a fresh interpreter on this checkout."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_importing_the_triggers_loads_neither_the_loop_nor_the_board() -> None:
    loaded = _fresh(
        "import json, sys\n"
        "import beatless.core.triggers\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('beatless'))))\n"
    )
    unwanted = {
        "beatless.node.scheduler",
        "beatless.node._board",
        "beatless.node.dispatch",
        "beatless.stores",
    }
    assert not unwanted & set(loaded), loaded


def test_the_public_names_and_documented_paths_still_import() -> None:
    public, same, module = _fresh(
        "import json\n"
        "import beatless\n"
        "public = {name: type(getattr(beatless, name)).__name__ for name in beatless.__all__}\n"
        "from beatless import Scheduler\n"
        "from beatless.node.scheduler import Decision\n"
        "from beatless.schedule.firing import Decision as Defined\n"
        "print(json.dumps([public, Decision is Defined, Scheduler.__module__]))\n"
    )
    assert public["Scheduler"] == "type", public
    assert public["open_store"] == "function", public
    assert same, "beatless.node.scheduler.Decision is not beatless.schedule.firing.Decision"
    assert module == "beatless.node.scheduler"


def test_each_old_module_path_is_the_moved_module_and_warns_once_imported() -> None:
    olds = sorted(old_paths())
    said = _fresh(
        "import json, warnings, importlib\n"
        "out = {}\n"
        f"for old in {olds!r}:\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    out[old] = [module.__name__, [str(w.message) for w in caught]]\n"
        "print(json.dumps(out))\n"
    )
    assert len(olds) >= 14
    for old in olds:
        name, warned = said[old]
        assert name != old, f"{old} is not the moved module"
        assert warned == [f"{old} moved to {name}; the old path goes in beatless 0.3"], warned


def test_the_architecture_page_describes_every_layer() -> None:
    page = (PACKAGE.parent / "docs/architecture.md").read_text()
    heads = [line.split("**")[1] for line in page.splitlines() if line.startswith("**")]
    missing = [p for layer in LAYERS for p in layer if not any(f"`{p}`" in h for h in heads)]
    assert not missing, f"docs/architecture.md has no paragraph for {missing}"
