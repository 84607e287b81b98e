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


def problems(sizes: dict[str, int]) -> list[str]:
    """What breaks the rule in ``sizes`` (module → lines): a module over the bound and
    not named, or a named one no longer over it."""
    over = sorted(n for n, lines in sizes.items() if lines > MAX_LINES and n not in COHESIVE)
    shrunk = sorted(n for n in COHESIVE if sizes.get(n, 0) <= MAX_LINES)
    return [f"{n}: over {MAX_LINES} lines, split it by concern" for n in over] + [
        f"{n}: no longer over {MAX_LINES} lines, drop it from COHESIVE" for n in shrunk
    ]


def test_no_module_is_over_the_bound_but_the_named_cohesive_ones() -> None:
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert problems(sizes) == []


def test_a_long_module_and_a_named_one_grown_short_are_both_caught() -> None:
    sizes = {"node/long.py": MAX_LINES + 1, "node/short.py": MAX_LINES}
    sizes |= dict.fromkeys(COHESIVE, MAX_LINES + 1)
    sizes[next(iter(COHESIVE))] = MAX_LINES
    found = problems(sizes)
    assert len(found) == 2
    assert found[0].startswith("node/long.py: over")
    assert found[1].startswith(f"{next(iter(COHESIVE))}: no longer over")
