"""The start-up rule of both integrations: every problem at once, then refuse or consume.

Before a node schedules anything it checks its whole schedule and collects every
problem it finds, each naming its entry: a bad trigger, a bad option, a timing rule
broken, a task that is unknown where that can be known, arguments the serializer
refuses. It never stops at the first.

* ``"refuse"`` (the default): the node does not start; one error lists every problem.
* ``"consume"``: the node starts and consumes tasks as any worker does. When every
  problem belongs to an entry, it schedules the other entries and leaves those out,
  each named in a WARNING with its problems and in its registry record (``beatless
  status`` lists them); when a problem is the whole schedule's (a setting, the claim
  store, a scheduler that keeps the schedule elsewhere), it schedules nothing and says so
  once at ERROR. Either way the list is kept in ``schedule_problems`` for a status or
  health check to read.

``beatless check --celery`` and ``beatless check --dramatiq`` run the same collection,
so a CI job finds before a deploy what a node would refuse at start.

The size limits of the store's notes are rules too, checked with the rest by
:func:`beatless.fleet.limits.checked`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from beatless.core._logtext import shown
from beatless.core.triggers import Every, Trigger
from beatless.errors import ConfigError, ScheduleError
from beatless.schedule.entry import Entry, Schedule

REFUSE = "refuse"
CONSUME = "consume"
ON_SCHEDULE_ERROR = (REFUSE, CONSUME)
"""What a node does when its schedule has problems."""

T = TypeVar("T")

STAND_IN_TRIGGER: Trigger = Every(60)
"""What an entry whose own trigger could not be built is checked with, so that the
problems of its other options are still found (the entry itself is refused)."""


@dataclass(frozen=True)
class Checked:
    """What checking a schedule found: the schedule when it is sound, every problem
    (each naming its entry) and warnings, which never stop a node."""

    schedule: Schedule | None
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    usable: Schedule | None = None
    """With problems that each belong to an entry: the schedule of the other entries,
    which a node with ``on_schedule_error = "consume"`` runs; ``None`` otherwise."""
    left_out: tuple[str, ...] = ()
    """The names of the entries :attr:`usable` leaves out, each for a problem of its own."""

    def problems_of(self, name: str) -> list[str]:
        """The problems that name the entry ``name``."""
        return [p for p in self.problems if p.startswith(f"entry {name!r}")]

    @property
    def is_sound(self) -> bool:
        return self.schedule is not None and not self.problems


def on_schedule_error(value: Any, *, name: str) -> str:
    """``value`` checked as one of :data:`ON_SCHEDULE_ERROR`; ``name`` names the setting."""
    if value not in ON_SCHEDULE_ERROR:
        raise ConfigError(
            f"{name} must be {REFUSE!r} (do not start with a bad schedule) or {CONSUME!r} "
            f"(consume tasks, schedule nothing), got {value!r}"
        )
    return str(value)


def collect(build: Callable[[], T], problems: list[str]) -> T | None:
    """``build()``, or ``None`` with its problems added to ``problems``."""
    try:
        return build()
    except ScheduleError as exc:
        problems.extend(one_line(error) for error in exc.errors)
    except ConfigError as exc:
        problems.append(one_line(str(exc)))
    return None


def keep(build: Callable[[], T], stand_in: T, problems: list[str]) -> T:
    """``build()``, or ``stand_in`` with its problems added to ``problems``: a part of
    an entry that is wrong, replaced so that the entry's other options are still
    checked."""
    built = collect(build, problems)
    return stand_in if built is None else built


def entry_of(label: str, problems: Iterable[str], build: Callable[[], Entry]) -> Entry:
    """The entry ``build()`` makes, when neither it nor what its front end found before
    (``problems``: an unknown option, a trigger that does not parse, whose stand-in
    ``build`` was given) has a problem. Otherwise one
    :class:`~beatless.errors.ScheduleError` with every problem of the entry, each
    starting with ``label``: a typo in one option never hides a rule another breaks."""
    found = list(problems)
    entry = collect(build, found)
    if entry is None or found:
        found = [labelled(label, problem) for problem in found]
        raise ScheduleError("; ".join(found), found)
    return entry


def labelled(label: str, problem: str) -> str:
    """``problem`` starting with ``label`` (``entry 'name'``), once."""
    return problem if problem.startswith(label) else f"{label}: {problem}"


def argument_problems(entry: Entry, encode: Callable[[Any], object], encoding: str) -> list[str]:
    """One problem per argument of ``entry`` that ``encode`` refuses, naming the argument
    and its type (never its value: arguments may hold secrets)."""
    named = [(f"args[{i}]", value) for i, value in enumerate(entry.args)]
    named += [(f"kwargs[{key!r}]", value) for key, value in entry.kwargs.items()]
    found = []
    for label, value in named:
        try:
            encode(value)
        except Exception as exc:  # any refusal of the encoder is the answer
            found.append(
                f"entry {entry.name!r}: {label} (a {type(value).__qualname__}) cannot be "
                f"encoded as {encoding}: {one_line(str(exc)) or type(exc).__name__}; give "
                f"values the serializer accepts (strings, numbers, lists, dicts)"
            )
    return found


def refusal(problems: Iterable[str], *, consume_with: str | None) -> ScheduleError:
    """The one error a node refuses to start with, listing every problem.

    ``consume_with`` is the line of configuration that would make the node consume
    instead (``None`` where that does not apply, as for a beat process)."""
    errors = list(problems)
    lines = "".join(f"\n  {problem}" for problem in errors)
    hint = "Fix them (`beatless check` lists the same problems)"
    if consume_with is not None:
        hint += f", or set {consume_with} to consume tasks here without scheduling"
    return ScheduleError(
        f"beatless: {_count(errors)} in the schedule; this node refuses to start:{lines}\n{hint}",
        errors,
    )


EXIT_REFUSED = 2
"""The exit code of a worker that refuses to start (as ``beatless`` exits on bad input)."""


def store_refusal(error: Exception, *, consume_with: str | None) -> str:
    """The one line a node refuses to start with when its claim store cannot be used:
    unreachable, refusing the credentials, or refusing what the node asked (``error``
    names the store, with its URL masked)."""
    hint = f", or set {consume_with} to consume tasks here without scheduling"
    return (
        f"beatless: this node refuses to start: its claim store cannot be used: "
        f"{one_line(str(error))}; fix the store URL or the server (`beatless check --store "
        f"URL` probes it){hint if consume_with is not None else ''}"
    )


def report_store_consuming(logger: logging.Logger, error: Exception, *, consume_with: str) -> None:
    """Say once, at ERROR, that this node schedules nothing because its claim store cannot
    be used."""
    logger.error(
        "beatless: the claim store cannot be used: %s; this node schedules nothing: it "
        "consumes tasks only (%s); nodes whose store answers go on scheduling",
        one_line(str(error)),
        consume_with,
    )


def to_run(found: Checked, mode: str) -> Schedule | None:
    """The schedule a node runs: the whole one when sound; under ``"consume"``, when each
    problem is one entry's and another entry is sound, the :attr:`~Checked.usable` part
    (say the others with :func:`report_left_out`); otherwise ``None``: nothing."""
    if found.schedule is not None:
        return found.schedule
    if mode != REFUSE and found.usable is not None and found.usable.entries:
        return found.usable
    return None


def report_left_out(logger: logging.Logger, found: Checked, *, consume_with: str) -> None:
    """Say at WARNING, once per entry, that this node leaves it out, with its problems."""
    kept = 0 if found.usable is None else len(found.usable.entries)
    for name in found.left_out:
        logger.warning(
            "beatless: entry %s is left out of this node's schedule: %s; the %d other "
            "entr%s scheduled (%s)",
            shown(name),
            "; ".join(found.problems_of(name)) or "it has a problem",
            kept,
            "y is" if kept == 1 else "ies are",
            consume_with,
        )


def report_consuming(logger: logging.Logger, problems: Iterable[str], *, consume_with: str) -> None:
    """Say once, at ERROR, that this node schedules nothing, and why."""
    errors = list(problems)
    lines = "".join(f"\n  {problem}" for problem in errors)
    logger.error(
        "beatless: %s in the schedule:%s\nThis node schedules nothing: it consumes tasks "
        "only (%s); nodes whose schedule is sound go on scheduling.",
        _count(errors),
        lines,
        consume_with,
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


def _count(errors: list[str]) -> str:
    return f"{len(errors)} problem" + ("" if len(errors) == 1 else "s")
