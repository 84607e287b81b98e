"""Every Python snippet in README.md and docs/*.md runs, and every TOML schedule loads.

Each fenced block is one test case, named ``file:line`` (the line of its opening fence).
An HTML comment on the line before the fence (blank lines between are allowed) says how
to take a Python block:

* no comment: run it in a fresh interpreter, in a temporary directory, with the
  repository on ``sys.path`` (so ``beatless`` and ``integrations`` import);
* ``<!-- snippet: continues -->``: run it after the blocks of the same page that come
  before it and are run, as a reader who reads the page in order has them;
* ``<!-- snippet: imports-only (why) -->``: compile it and run its import statements
  only: it acts on objects of the reader's own project, or needs a service to run;
* ``<!-- snippet: skip (why) -->``: compile it only. The reason is required.
* ``<!-- snippet: redbeat (why) -->``: run it for real against a RedBeat schedule the
  test writes first with RedBeat's own ``RedBeatSchedulerEntry(...).save()``, in the
  local Redis (database 13) under a key prefix of its own, deleted at the end: the
  snippet's ``redbeat://redis:6379/1`` is that Redis, ``app`` the Celery app that wrote
  the entries. What the snippet left in ``found`` (an import) is checked
  (:func:`check_redbeat`). Skipped when Redis is not reachable (failed with
  ``BEATLESS_REQUIRE_SERVICES=1``).

After a snippet has run, the beatless schedule of each Celery app and each Dramatiq
broker with the middleware that it left in its namespace is built, as a worker builds it
at start (without connecting), so that a schedule the timing rules refuse fails here.
Tracebacks name the page and the line in it. A TOML block is a schedule file: it must
load with :func:`beatless.cli.loader.load_toml`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from beatless import Schedule
from beatless.cli.loader import load_toml

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,})\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^<!--\s*snippet:\s*(?P<kind>[\w-]+)\s*(?:\((?P<why>[^)]*)\))?\s*-->$")
KINDS = ("continues", "imports-only", "skip", "redbeat")
RUN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, first code line and text."""

    path: Path
    line: int
    """The line of the opening fence, counting from 1; the code starts on the next."""
    lang: str
    code: str
    kind: str | None
    why: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def placed(self) -> str:
        """The code preceded by blank lines, so that its line numbers are the page's."""
        return "\n" * self.line + self.code


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, each with the snippet marker before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = [line[indent:] for line in lines[index + 1 : end]]
        kind, why = _marker(lines, index)
        code = "\n".join(body) + "\n"
        found.append(Block(path, index + 1, opening["lang"].lower(), code, kind, why))
        index = end + 1
    return found


def _marker(lines: list[str], fence_index: int) -> tuple[str | None, str | None]:
    above = fence_index - 1
    while above >= 0 and not lines[above].strip():
        above -= 1
    marker = MARKER.match(lines[above].strip()) if above >= 0 else None
    if marker is None:
        return None, None
    return marker["kind"], (marker["why"] or "").strip() or None


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
PYTHON = [block for block in ALL_BLOCKS if block.lang in ("python", "py")]
TOML = [block for block in ALL_BLOCKS if block.lang == "toml"]


def chain(block: Block) -> list[Block]:
    """The blocks to run for ``block``, in page order: for a ``continues`` block, every
    earlier block of its page that is run, then the block itself."""
    if block.kind != "continues":
        return [block]
    earlier = [
        b
        for b in PYTHON
        if b.path == block.path and b.line < block.line and b.kind in (None, "continues")
    ]
    assert earlier, f"{block.id}: 'continues', but no Python block before it is run"
    return [*earlier, block]


def run(source: str, filename: Path, cwd: Path) -> str:
    """Run ``source`` with :func:`execute` in a fresh interpreter, in ``cwd``; its output."""
    path = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    runner = "import sys, test_docs; test_docs.execute(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-c", runner, str(filename)],
        input=source,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def execute(filename: str) -> None:
    """Run the snippet read from stdin in a fresh namespace, then build the beatless
    schedule of every Celery app and every Dramatiq broker with the middleware it left
    there, as a worker would at start (without connecting), so that a schedule the
    timing rules refuse fails here too."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(sys.stdin.read(), filename, "exec"), namespace)  # noqa: S102 - the snippet under test
    for value in list(namespace.values()):
        build(value)


def build(value: object) -> None:
    if "celery" in sys.modules:
        from celery import Celery

        from beatless.celery import read_schedule

        if isinstance(value, Celery) and value.conf.beat_schedule:
            read_schedule(value)
    if "dramatiq" in sys.modules:
        from dramatiq import Broker

        from beatless.dramatiq import Beatless

        if isinstance(value, Broker):
            for middleware in value.middleware:
                if isinstance(middleware, Beatless):
                    middleware.schedule(value)


def imports_of(block: Block) -> str:
    """The import statements of a block at their lines, the rest left blank."""
    tree = ast.parse(block.placed(), filename=str(block.path))
    lines = block.placed().splitlines()
    kept = [""] * len(lines)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            start, end = node.lineno - 1, (node.end_lineno or node.lineno)
            indent = len(lines[start]) - len(lines[start].lstrip())
            kept[start:end] = [line[indent:] for line in lines[start:end]]
    return "\n".join(kept) + "\n"


def test_every_page_is_read_and_python_snippets_are_found() -> None:
    assert (ROOT / "README.md") in PAGES
    assert len(PAGES) > 5
    assert {block.path.name for block in PYTHON} >= {"README.md", "celery.md", "dramatiq.md"}


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.id for block in ALL_BLOCKS])
def test_snippet_markers_are_known_and_skips_say_why(block: Block) -> None:
    if block.kind is None:
        return
    assert block.kind in KINDS, f"{block.id}: unknown snippet marker {block.kind!r}"
    assert block.lang in ("python", "py") or block.kind == "skip", (
        f"{block.id}: {block.kind!r} applies to Python blocks only"
    )
    if block.kind == "skip":
        assert block.why, f"{block.id}: a skipped snippet says why: <!-- snippet: skip (why) -->"


@pytest.mark.parametrize("block", PYTHON, ids=[block.id for block in PYTHON])
def test_python_snippet_runs(block: Block, tmp_path: Path) -> None:
    compile(block.placed(), str(block.path), "exec")
    if block.kind == "skip":
        pytest.skip(f"{block.id}: {block.why}")
    if block.kind == "imports-only":
        run(imports_of(block), block.path, tmp_path)
        return
    if block.kind == "redbeat":
        with redbeat_written() as prefix:
            said = run(redbeat_source(block, prefix), block.path, tmp_path)
        check_redbeat(block, said)
        return
    blocks_to_run = chain(block)
    lines: list[str] = []
    for part in blocks_to_run:
        placed = part.placed().splitlines()
        lines += placed[len(lines) :]
    run("\n".join(lines) + "\n", block.path, tmp_path)


REDBEAT_HOST, REDBEAT_PORT, REDBEAT_DB = "127.0.0.1", 6379, 13
REDBEAT_GUIDE_URL = "redbeat://redis:6379/1"
"""The Redis a ``redbeat`` snippet names, replaced with the test's."""
REDBEAT_APP = (
    "from celery import Celery as _Celery; "
    "app = _Celery({prefix!r}, broker='memory://'); "
    "app.conf.update(beatless_store_url='memory://', timezone='UTC', "
    "redbeat_redis_url={url!r}, redbeat_key_prefix={prefix!r} + ':', "
    "beat_schedule={{'cleanup': {{'task': 'proj.cleanup', 'schedule': 3600.0}}}})"
)
"""The reader's app, as ``redbeat_app`` writes with it, on one line (the snippet keeps
its page's line numbers)."""
REDBEAT_FOUND = "\nimport json as _json; print('FOUND', _json.dumps(found.to_json()))\n"


def redbeat_app(prefix: str) -> Any:
    """A Celery app whose RedBeat writes in the test's Redis under ``prefix:``; its
    ``beat_schedule`` has one entry, ``cleanup`` (RedBeat's static)."""
    from celery import Celery

    app = Celery(prefix, broker="memory://", set_as_current=False)
    app.conf.update(
        timezone="UTC",
        redbeat_redis_url=f"redis://{REDBEAT_HOST}:{REDBEAT_PORT}/{REDBEAT_DB}",
        redbeat_key_prefix=f"{prefix}:",
        beat_schedule={"cleanup": {"task": "proj.cleanup", "schedule": 3600.0}},
    )
    return app


@contextlib.contextmanager
def redbeat_written() -> Iterator[str]:
    """A RedBeat schedule written as RedBeat's users write one, under a key prefix of
    its own (yielded); its keys, and only they, are deleted at the end."""
    from service_check import require_service

    pytest.importorskip("redbeat", reason="needs celery-redbeat (the dev group has it)")
    require_service("Redis", REDBEAT_HOST, REDBEAT_PORT)
    import redis
    from celery.schedules import crontab, schedule
    from redbeat import RedBeatScheduler, RedBeatSchedulerEntry
    from redbeat.schedules import rrule

    prefix = f"bltest-docs-{uuid.uuid4().hex[:10]}"
    client = redis.Redis(host=REDBEAT_HOST, port=REDBEAT_PORT, db=REDBEAT_DB)
    try:
        app = redbeat_app(prefix)
        RedBeatScheduler(app=app, lazy=True).setup_schedule()  # the static: cleanup
        now = datetime.now(UTC)
        ran = now - timedelta(minutes=5)
        later = (now + timedelta(days=30)).replace(microsecond=0)
        past = (now - timedelta(days=1)).replace(microsecond=0)
        written = {
            "report": crontab(minute=0, hour=3),
            "sync": schedule(timedelta(seconds=90)),
            "welcome-mail": rrule("MINUTELY", dtstart=later, count=1),
            "launch": rrule("MINUTELY", dtstart=past, count=1),
        }
        for name, value in written.items():
            RedBeatSchedulerEntry(
                name, f"proj.{name}", value, args=[name], app=app, last_run_at=ran
            ).save()
        yield prefix
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1_000):
            client.delete(key)
        client.close()


def redbeat_source(block: Block, prefix: str) -> str:
    """The snippet on the test's Redis, after the reader's ``app`` (on a line of the
    blank ones before it), and a line that prints what it left in ``found``."""
    url = f"redbeat://{REDBEAT_HOST}:{REDBEAT_PORT}/{REDBEAT_DB}"
    assert REDBEAT_GUIDE_URL in block.code, f"{block.id}: no {REDBEAT_GUIDE_URL} to replace"
    lines = block.placed().replace(REDBEAT_GUIDE_URL, url).splitlines()
    assert not lines[0], block.id
    lines[0] = REDBEAT_APP.format(prefix=prefix, url=url.replace("redbeat:", "redis:"))
    return "\n".join(lines) + "\n" + REDBEAT_FOUND


def check_redbeat(block: Block, said: str) -> None:
    """What the guide's import found in the schedule :func:`redbeat_written` wrote."""
    found = [line for line in said.splitlines() if line.startswith("FOUND ")]
    assert len(found) == 1, f"{block.id}: the snippet left no import in 'found'\n{said}"
    done = json.loads(found[0].removeprefix("FOUND "))
    assert sorted(done["imported"]) == ["report", "sync", "welcome-mail"], done
    assert done["statics"] == ["cleanup"], done
    skipped = {s["name"]: s["why"] for s in done["skipped"]}
    assert sorted(skipped) == ["celery.backend_cleanup", "launch"], done  # beat saves the first
    assert "already past" in skipped["launch"], done
    assert sorted(c["name"] for c in done["plan"]["changes"]) == ["report", "sync", "welcome-mail"]
    assert done["revision"] is None, done  # the guide's dry run writes nothing


@pytest.mark.parametrize("block", TOML, ids=[block.id for block in TOML])
def test_toml_schedule_loads(block: Block, tmp_path: Path) -> None:
    if block.kind == "skip":
        pytest.skip(f"{block.id}: {block.why}")
    path = tmp_path / "schedule.toml"
    path.write_text(block.code, encoding="utf-8")
    schedule = load_toml(path)
    assert isinstance(schedule, Schedule)
    assert schedule.entries
