"""No module of the package is over :data:`MAX_LINES` lines, but the few named in
:data:`COHESIVE`, each one class whose parts share its state (``docs/architecture.md``,
"Module size", says which and why). A module that grows past the bound is split by
concern; one named here that shrinks below it leaves the list."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "beatless"
MAX_LINES = 600
COHESIVE = {
    "stores/rabbitmq/_amqp.py": "one AMQP session driven as a state machine: every callback "
    "reads and moves the same lanes, scripts and deadline",
    "stores/redis/store.py": "one class, RedisStore, the claim-store contract on Redis: each "
    "method is one script call over the same client, keys and epoch",
}


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_the_bound_but_the_named_cohesive_ones() -> None:
    sizes = {p.relative_to(PACKAGE).as_posix(): lines_of(p) for p in PACKAGE.rglob("*.py")}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in COHESIVE}
    assert not over, f"modules over {MAX_LINES} lines: split them by concern: {over}"
    shrunk = [name for name in COHESIVE if sizes.get(name, 0) <= MAX_LINES]
    assert not shrunk, f"no longer over {MAX_LINES} lines: drop them from COHESIVE: {shrunk}"


def test_the_bound_catches_a_long_module(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert lines_of(long) > MAX_LINES
