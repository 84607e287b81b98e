"""Every install line the docs give works as written, in a fresh venv, end to end.

The dev venv has every package of every extra, so it cannot show that an extra misses
one. Here each documented ``pip install`` line runs, exactly as written, in a new venv
(no dev group) from a copy of this checkout; then that integration's own processes
(``beatless check --celery`` / ``--dramatiq``, then ``celery worker`` or ``dramatiq``) run
from that venv on a small app written to a temporary directory, with a one-second entry,
on every broker the docs give the line for (its default claim store), and every
occurrence must run exactly once. A line that lacks a broker's driver (the Celery-on-Redis
line on RabbitMQ) must say so in one line naming the extra, at check and at start. Only
the commands use the fresh venv; this test runs in the dev venv. The lines of the
feature extras run what each adds: ``django`` migrates a Django project on SQLite, makes
a ``PeriodicTask`` row through the ORM and has a Celery worker run it through the
bridge; ``solar`` computes a sunset with ``Solar`` and ``beatless next``; ``redbeat``
plans, with ``--dry-run``, the import of entries ``RedBeatSchedulerEntry(...).save()``
wrote.

The fast tests here keep the docs and the declarations honest: every documented line
has a case below, every package an integration imports is declared by its extras, and
the test group installs every package of those extras (the latest releases; the lowest
ones are ``.ci/matrix``'s), and a missing driver is one line naming its extra.

Redis: database 9, keys under a prefix of each test's own, deleted at the end. RabbitMQ:
queues and exchanges named after that prefix, deleted at the end.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from service_check import require_service

from beatless.core._time import iso
from beatless.schedule.firing import firing_id

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REDIS_URL = "redis://127.0.0.1:6379/9"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
PIKA_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
"""The same server and vhost ``/``, as pika (and so Dramatiq) spells it."""

DEMO = "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/beatless demo"
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -U pip && "
    ".venv/bin/pip install -e . --group dev && .venv/bin/python -m pytest -n auto --dist loadgroup"
)
CELERY = "pip install '.[celery,redis]'"
CELERY_RABBITMQ = "pip install '.[celery,rabbitmq]'"
DRAMATIQ = "pip install '.[dramatiq,redis]'"
DRAMATIQ_RABBITMQ = "pip install '.[dramatiq,rabbitmq,redis]'"
DJANGO = "pip install '.[django]'"
SOLAR = "pip install '.[solar]'"
REDBEAT = "pip install '.[redbeat]'"
KNOWN_LINES = {
    DEMO,
    TEST_COMMAND,
    CELERY,
    CELERY_RABBITMQ,
    DRAMATIQ,
    DRAMATIQ_RABBITMQ,
    DJANGO,
    SOLAR,
    REDBEAT,
}
"""Every documented install line; the test command is the one ``.ci/run`` runs."""

INSTALL_TIMEOUT_S = 300.0
RUN_S = 8.0
"""How long the nodes run once all are ready."""
WARMUP_S = 2.0
"""Occurrences this soon after the nodes are ready are not required (a node may start
its loop just after one)."""
SETTLE_S = 1.5
"""Occurrences this close to the stop are not required (their task may still run)."""
COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "build",
    "dist",
    "site",
    "*.db",
)


# -- the docs and the declarations (fast) ----------------------------------------------


def documented_install_lines() -> dict[str, list[str]]:
    """Each ``pip install`` command of README.md and docs/, in a fenced block (its trailing
    ``# comment`` left out) or in inline code, with where it is (``page:line``)."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        fenced = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                commands = [re.sub(r"\s+#.*$", "", line.strip())] if "pip install" in line else []
            else:
                commands = re.findall(r"`([^`]*pip install[^`]*)`", line)
            for command in commands:
                found.setdefault(command, []).append(f"{page.relative_to(ROOT)}:{number}")
    return found


def test_every_documented_install_line_has_a_test_here() -> None:
    found = documented_install_lines()
    assert set(found) == KNOWN_LINES, {line: found.get(line) for line in set(found) ^ KNOWN_LINES}


def test_the_documented_test_command_is_what_ci_runs() -> None:
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement.strip(), maxsplit=1)[0].lower()


def _declared(*extras: str) -> set[str]:
    optional = _pyproject()["project"]["optional-dependencies"]
    return {_name(r) for extra in extras for r in optional[extra]}


def _imported_distributions(package: Path) -> dict[str, set[str]]:
    """The distributions whose modules the package's files import (``import x``,
    ``from x import y``, ``importlib.import_module("x")``), each with the files."""
    distributions = importlib.metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                modules = [node.args[0].value]
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "beatless":
                    continue
                for distribution in distributions.get(top, [top]):
                    found.setdefault(distribution.lower(), set()).add(path.name)
    return found


@pytest.mark.parametrize(
    ("package", "extras"),
    [
        ("celery", ("celery", "redis", "redbeat")),
        ("dramatiq", ("dramatiq", "redis", "rabbitmq")),
        ("django", ("django",)),
    ],
)
def test_every_package_an_integration_imports_is_declared_by_its_extras(
    package: str, extras: tuple[str, ...]
) -> None:
    imported = _imported_distributions(ROOT / "beatless" / package)
    undeclared = {name: files for name, files in imported.items() if name not in _declared(*extras)}
    assert not undeclared, f"beatless.{package} imports packages its extras {extras} lack"


def test_the_test_group_installs_every_package_of_the_integration_extras() -> None:
    test_group = {_name(r) for r in _pyproject()["dependency-groups"]["test"] if isinstance(r, str)}
    assert _declared("celery", "dramatiq", "redis", "rabbitmq", "django") <= test_group


def test_every_driver_the_hint_names_is_what_its_extra_declares() -> None:
    from beatless.core._drivers import EXTRAS

    for package, extra in EXTRAS.values():
        assert package in _declared(extra), (package, extra)


DRIVERS = [
    ("redis://127.0.0.1:6379/9", "redis", "redis"),
    ("redis+cluster://127.0.0.1:7000", "redis", "redis"),
    ("postgresql://user@127.0.0.1/test", "psycopg", "postgres"),
    ("nats://127.0.0.1:4222", "nats", "nats"),
    ("amqp://guest:guest@127.0.0.1:5672/%2F", "pika", "rabbitmq"),
]
"""A store URL of each kind, the driver its store imports, and the extra that installs it."""


def hide(monkeypatch: pytest.MonkeyPatch, driver: str) -> None:
    """Make ``driver`` uninstalled for this test, and the store modules that imported it
    unimported (they import it again, and fail, as in a venv without it)."""
    for name in list(sys.modules):
        if name == driver or name.startswith(f"{driver}."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, driver, None)
    import beatless.stores.nats
    import beatless.stores.rabbitmq

    # `from beatless.stores.rabbitmq import _amqp` imports anew
    for package, name in (
        (beatless.stores.rabbitmq, "_amqp"),
        (beatless.stores.nats, "_jetstream"),
    ):
        monkeypatch.delitem(sys.modules, f"{package.__name__}.{name}", raising=False)
        monkeypatch.delattr(package, name, raising=False)


@pytest.mark.parametrize(("url", "driver", "extra"), DRIVERS)
def test_a_missing_driver_is_one_line_naming_its_extra_when_the_store_opens_and_at_check(
    url: str, driver: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from beatless.errors import ConfigError
    from beatless.stores import missing_driver, open_store

    hide(monkeypatch, driver)
    with pytest.raises(ConfigError) as caught:
        open_store(url, namespace="app")
    said = str(caught.value)
    assert "\n" not in said
    assert f"which beatless's {extra} extra installs: pip install 'beatless[{extra}]'" in said
    assert missing_driver(url) == said


def test_a_missing_metrics_driver_is_one_line_naming_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from beatless.errors import ConfigError
    from beatless.ops import metrics

    hide(monkeypatch, "prometheus_client")
    with pytest.raises(ConfigError, match=r"^beatless metrics needs the prometheus-client .*"):
        metrics.require()


def test_celery_on_rabbitmq_without_pika_is_a_problem_at_check_and_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from celery import Celery

    from beatless.celery._schedule import check_app
    from beatless.celery._worker import BeatlessStep, StartRefused

    hide(monkeypatch, "pika")
    app = Celery("proj", broker=AMQP_URL, set_as_current=False)
    app.conf.beat_schedule = {"tick": {"task": "proj.tick", "schedule": 1.0}}
    (problem,) = check_app(app).problems
    assert problem.startswith(
        "the claim store (the broker's own server) amqp://guest:***@127.0.0.1:5672/%2F: "
        "the rabbitmq store needs the pika package, which beatless's rabbitmq extra installs"
    )
    worker = SimpleNamespace(app=app, hostname="w")
    with pytest.raises(StartRefused) as caught:
        BeatlessStep(worker).start(worker)
    assert problem in caught.value.reason


def test_dramatiq_with_a_store_whose_driver_is_missing_is_a_problem_at_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dramatiq.brokers.stub import StubBroker

    from beatless.dramatiq import Beatless

    hide(monkeypatch, "psycopg")
    broker = StubBroker()
    middleware = Beatless(store="postgresql://app:s3cret@db/app", namespace="app")
    broker.add_middleware(middleware)
    (problem,) = middleware.check(broker).problems
    assert problem.startswith(
        "Beatless store postgresql://app:***@db/app: the postgres store needs the psycopg "
        "package, which beatless's postgres extra installs"
    )


# -- fresh venvs -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this checkout, as a user's clone: the lines run in its root, and a build
    there leaves nothing in the tree others work in."""
    copy = tmp_path_factory.mktemp("clone") / "beatless"
    shutil.copytree(ROOT, copy, ignore=COPY_IGNORE)
    return copy


def venv_environment(venv: Path) -> dict[str, str]:
    """The environment of a shell in which ``venv`` is active, and nothing of the dev venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), os.environ.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_line(line: str, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run one documented line with bash, as a user pastes it; its output, or fail."""
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", line],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{line!r} failed after {took:.0f}s:\n{output[-4_000:]}"
    print(f"{line!r}: {took:.1f}s")  # shown with -s: how long each install takes
    return output


@pytest.fixture(scope="module")
def installed(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``installed(line)``: a fresh venv in which ``line`` ran in the clone's root (made
    once per line for this module); ``pip check`` passes and beatless comes from it."""
    venvs: dict[str, Path] = {}

    def make(line: str) -> Path:
        if line not in venvs:
            venv = tmp_path_factory.mktemp("venv")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            env = venv_environment(venv)
            run_line(line, checkout, env, INSTALL_TIMEOUT_S)
            run_line("pip check", checkout, env, 60)
            where = subprocess.run(
                [str(venv / "bin" / "python"), "-c", "import beatless; print(beatless.__file__)"],
                cwd=tmp_path_factory.getbasetemp(),
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout.strip()
            assert where.startswith(str(venv)), f"beatless imported from {where}, not the venv"
            venvs[line] = venv
        return venvs[line]

    return make


# -- nodes -----------------------------------------------------------------------------


@dataclass
class Node:
    """One worker command in a session of its own: stopped, then killed, by group."""

    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, deadline: float) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(max(deadline - time.monotonic(), 0.1))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)


@dataclass
class Project:
    """An app module in a temporary directory, run by the fresh venv's commands."""

    directory: Path
    venv: Path
    prefix: str
    nodes: list[Node]

    def start(self, name: str, command: list[str], env: dict[str, str]) -> Node:
        log = self.directory / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(self.venv / "bin" / command[0]), *command[1:]],
                cwd=self.directory,
                env={**venv_environment(self.venv), "PYTHONPATH": str(self.directory), **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node = Node(process, log)
        self.nodes.append(node)
        return node

    def run(self, command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """One command of the venv, to its end (``beatless check``)."""
        return subprocess.run(
            [str(self.venv / "bin" / command[0]), *command[1:]],
            cwd=self.directory,
            env={**venv_environment(self.venv), "PYTHONPATH": str(self.directory), **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def stop_all(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            if node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            node.stop(deadline)

    def logs(self) -> str:
        return "\n".join(f"--- node {i}\n{n.text()[-3_000:]}" for i, n in enumerate(self.nodes))


@pytest.fixture
def redis_client() -> Iterator[Any]:
    require_service("Redis", "127.0.0.1", 6379)
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def project(tmp_path: Path, redis_client: Any) -> Iterator[Callable[[Path], Project]]:
    """``project(venv)``: an app directory and a prefix of this test's own; at the end its
    processes are stopped and its Redis keys deleted."""
    prefix = f"blinstall{uuid.uuid4().hex[:10]}"
    made: list[Project] = []

    def make(venv: Path) -> Project:
        made.append(Project(tmp_path, venv, prefix, []))
        return made[-1]

    try:
        yield make
    finally:
        for each in made:
            each.stop_all()
        for key in redis_client.scan_iter(match=f"*{prefix}*", count=1_000):
            redis_client.delete(key)


def delete_rabbitmq(queues: list[str], exchanges: list[str]) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(PIKA_URL))
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue=queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange=exchange)
    finally:
        connection.close()


def delete_rabbitmq_store(prefix: str, window: tuple[float, float]) -> None:
    """What the RabbitMQ store of namespace ``prefix`` keeps: its epoch and notes queues,
    its exchange, and the slot of each firing of ``prefix/tick`` that can have been
    claimed in ``window`` (catch-up included); other slots expire on their own."""
    store = f"beatless.{prefix}."
    first, last = int(window[0]) - 70, int(window[1]) + 5
    slots = [f"{store}c.{firing_id(f'{prefix}/tick', s * 1_000)}" for s in range(first, last)]
    delete_rabbitmq([f"{store}epoch", f"{store}notes", *slots], [f"{store}slots"])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, project: Project) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        dead = [n for n in project.nodes if n.process.poll() is not None]
        assert not dead, f"a node exited before {what}:\n{project.logs()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s:\n{project.logs()}"
        time.sleep(0.2)


def run_nodes(project: Project, ready: Callable[[Node], bool]) -> tuple[float, float]:
    """Wait until every node is ready, let them run for ``RUN_S``, stop them all; the
    wall-clock window ``(ready, stopped)``."""
    wait_until(lambda: all(ready(n) for n in project.nodes), 60, "ready line", project)
    began = time.time()
    time.sleep(RUN_S)
    ended = time.time()
    project.stop_all()
    return began, ended


def check_runs(
    runs: list[dict[str, Any]], address: str, window: tuple[float, float], logs: str
) -> None:
    """Each whole second of the window ran once, with the firing id as message id, and no
    occurrence ran twice, in the window or out of it."""
    occurrences = Counter(r["occurrence_ms"] for r in runs)
    twice = sorted(o for o, n in occurrences.items() if n > 1)
    first = int(window[0] + WARMUP_S) + 1
    last = int(window[1] - SETTLE_S)
    expected = [s * 1_000 for s in range(first, last + 1)]
    missed = [o for o in expected if o not in occurrences]
    wrong = [r for r in runs if r["id"] != firing_id(address, r["occurrence_ms"])]
    summary = f"{len(runs)} runs, {len(expected)} expected, {twice=}, {missed=}, {wrong=}"
    assert len(expected) >= RUN_S - WARMUP_S - SETTLE_S - 1, summary
    assert not twice, f"{summary}\n{logs}"
    assert not missed, f"{summary}\n{logs}"
    assert not wrong, f"{summary}\n{logs}"
    assert "Traceback" not in logs, logs


def read_runs(redis_client: Any, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in redis_client.lrange(f"{prefix}:runs", 0, -1)]


# -- Celery ----------------------------------------------------------------------------

CELERY_APP = '''
"""A user's Celery app: one entry every second (with BT_DJANGO, the rows of its Django
project instead); each run is noted in a Redis list."""

import json
import os

import redis
from celery import Celery

import beatless.celery

PREFIX = os.environ["BT_PREFIX"]
app = Celery(PREFIX, broker=os.environ["BT_BROKER"])
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX + ":"},
    task_default_queue=PREFIX,
    worker_enable_remote_control=False,
    beat_schedule={"tick": {"task": "bt.tick", "schedule": 1.0}},
    beatless_namespace=PREFIX,
)
if os.environ.get("BT_DJANGO"):  # the row "tick" of django-celery-beat instead
    app.conf.update(beat_schedule={}, beatless_django=True)
if os.environ.get("BT_STORE"):
    app.conf.beatless_store_url = os.environ["BT_STORE"]
beatless.celery.install(app)

_runs = redis.Redis.from_url(os.environ["BT_RECORD"])


@app.task(bind=True, name="bt.tick")
def tick(self, *args):
    when = beatless.celery.occurrence(self.request)
    _runs.rpush(PREFIX + ":runs", json.dumps({
        "id": self.request.id,
        "occurrence_ms": round(when.timestamp() * 1000),
        "pid": os.getpid(),
        "args": list(args),
        "name": getattr(self.request, "periodic_task_name", None),
    }))
'''


def celery_env(project: Project, broker: str, store: str | None) -> dict[str, str]:
    (project.directory / "bt_celery.py").write_text(textwrap.dedent(CELERY_APP))
    env = {"BT_PREFIX": project.prefix, "BT_BROKER": broker, "BT_RECORD": REDIS_URL}
    if store:
        env["BT_STORE"] = store
    return env


def start_celery(project: Project, env: dict[str, str], names: tuple[str, ...]) -> None:
    for name in names:
        worker = ["celery", "-A", "bt_celery", "worker", "-n", f"{name}-{project.prefix}@%h"]
        quiet = ["--without-mingle", "--without-gossip", "--without-heartbeat"]
        project.start(name, [*worker, "-c", "1", "-l", "INFO", *quiet], env)


def run_celery(project: Project, broker: str, store: str | None) -> tuple[float, float]:
    """``beatless check --celery`` passes, then two workers run the entry."""
    env = celery_env(project, broker, store)
    checked = project.run(["beatless", "check", "--celery", "bt_celery:app"], env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "bt_celery:app: sound — 1 entries" in checked.stdout, checked.stdout
    start_celery(project, env, ("one", "two"))
    return run_nodes(project, lambda node: " ready." in node.text())


@pytest.mark.slow
def test_celery_line_runs_two_workers_on_redis_each_occurrence_once(
    installed: Callable[[str], Path], project: Callable[[Path], Project], redis_client: Any
) -> None:
    nodes = project(installed(CELERY))
    window = run_celery(nodes, REDIS_URL, store=None)
    runs = read_runs(redis_client, nodes.prefix)
    check_runs(runs, f"{nodes.prefix}/tick", window, nodes.logs())


@pytest.mark.slow
def test_celery_rabbitmq_line_runs_two_workers_on_rabbitmq_with_claims_in_rabbitmq(
    installed: Callable[[str], Path], project: Callable[[Path], Project], redis_client: Any
) -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    nodes = project(installed(CELERY_RABBITMQ))
    window = (time.time(), time.time())
    try:
        window = run_celery(nodes, AMQP_URL, store=None)  # the store follows the broker
    finally:
        nodes.stop_all()
        delete_rabbitmq([nodes.prefix], [nodes.prefix])
        delete_rabbitmq_store(nodes.prefix, window)
    runs = read_runs(redis_client, nodes.prefix)
    check_runs(runs, f"{nodes.prefix}/tick", window, nodes.logs())


@pytest.mark.slow
def test_celery_line_runs_two_workers_on_rabbitmq_with_claims_in_redis(
    installed: Callable[[str], Path], project: Callable[[Path], Project], redis_client: Any
) -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    nodes = project(installed(CELERY))
    try:
        window = run_celery(nodes, AMQP_URL, store=REDIS_URL)
    finally:
        nodes.stop_all()
        delete_rabbitmq([nodes.prefix], [nodes.prefix])
    runs = read_runs(redis_client, nodes.prefix)
    check_runs(runs, f"{nodes.prefix}/tick", window, nodes.logs())


@pytest.mark.slow
def test_celery_line_on_rabbitmq_with_claims_in_rabbitmq_names_the_missing_extra_in_one_line(
    installed: Callable[[str], Path], project: Callable[[Path], Project]
) -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    nodes = project(installed(CELERY))
    hint = "the rabbitmq store needs the pika package, which beatless's rabbitmq extra installs"
    env = celery_env(nodes, AMQP_URL, store=None)
    checked = nodes.run(["beatless", "check", "--celery", "bt_celery:app"], env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert hint in checked.stderr
    assert "sound" not in checked.stdout
    start_celery(nodes, env, ("one",))
    (worker,) = nodes.nodes
    try:
        worker.process.wait(60)
    finally:
        nodes.stop_all()
        delete_rabbitmq([nodes.prefix], [nodes.prefix])
    log = worker.text()
    assert worker.process.returncode == 2, log
    (said,) = [line for line in log.splitlines() if "CRITICAL" in line]
    assert "this node refuses to start" in said
    assert hint in log
    assert "Traceback" not in log
    assert "ModuleNotFoundError" not in log


# -- Dramatiq --------------------------------------------------------------------------

DRAMATIQ_APP = '''
"""A user's Dramatiq app: one periodic actor every second; runs noted in a Redis list."""

import json
import os

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage

from beatless.dramatiq import Beatless, every

PREFIX = os.environ["BT_PREFIX"]
BROKER = os.environ["BT_BROKER"]
if BROKER.startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=BROKER, confirm_delivery=True)
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=BROKER, namespace=PREFIX + "-dramatiq")
broker.add_middleware(CurrentMessage())
broker.add_middleware(Beatless(store=os.environ["BT_STORE"] or None, namespace=PREFIX))
dramatiq.set_broker(broker)

_runs = redis.Redis.from_url(os.environ["BT_RECORD"])


@dramatiq.actor(queue_name=PREFIX, periodic=every("1s"))
def tick():
    message = CurrentMessage.get_current_message()
    _runs.rpush(PREFIX + ":runs", json.dumps({
        "id": message.message_id,
        "occurrence_ms": message.message_timestamp,
        "pid": os.getpid(),
    }))
'''


def run_dramatiq(project: Project, broker: str, store: str | None) -> tuple[float, float]:
    """``beatless check --dramatiq`` passes, then two nodes run the periodic actor."""
    (project.directory / "bt_dramatiq.py").write_text(textwrap.dedent(DRAMATIQ_APP))
    env = {
        "BT_PREFIX": project.prefix,
        "BT_BROKER": broker,
        "BT_STORE": store or "",
        "BT_RECORD": REDIS_URL,
    }
    checked = project.run(["beatless", "check", "--dramatiq", "bt_dramatiq"], env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "bt_dramatiq: sound — 1 entries" in checked.stdout, checked.stdout
    for name in ("one", "two"):
        project.start(name, ["dramatiq", "bt_dramatiq", "--processes", "1", "--threads", "1"], env)
    return run_nodes(project, lambda node: "ready for action" in node.text())


@pytest.mark.slow
def test_dramatiq_line_runs_two_nodes_on_redis_each_occurrence_once(
    installed: Callable[[str], Path], project: Callable[[Path], Project], redis_client: Any
) -> None:
    nodes = project(installed(DRAMATIQ))
    window = run_dramatiq(nodes, REDIS_URL, store=REDIS_URL)
    runs = read_runs(redis_client, nodes.prefix)
    check_runs(runs, f"{nodes.prefix}/tick", window, nodes.logs())


@pytest.mark.slow
def test_dramatiq_rabbitmq_line_runs_two_nodes_with_claims_in_rabbitmq(
    installed: Callable[[str], Path], project: Callable[[Path], Project], redis_client: Any
) -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    nodes = project(installed(DRAMATIQ_RABBITMQ))
    queues = [nodes.prefix, f"{nodes.prefix}.DQ", f"{nodes.prefix}.XQ"]
    window = (time.time(), time.time())
    try:
        window = run_dramatiq(nodes, PIKA_URL, store=None)  # the store follows the broker
    finally:
        nodes.stop_all()
        delete_rabbitmq(queues, [])
        delete_rabbitmq_store(nodes.prefix, window)
    runs = read_runs(redis_client, nodes.prefix)
    check_runs(runs, f"{nodes.prefix}/tick", window, nodes.logs())


# -- the feature extras ----------------------------------------------------------------

DJANGO_SETTINGS = """
import os

SECRET_KEY = "install-test-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["BT_SQLITE"]},
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""
"""A user's Django project: django-celery-beat's tables in a SQLite file."""

DJANGO_ROW = """
import django

django.setup()
from django_celery_beat.models import IntervalSchedule, PeriodicTask

every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.create(name="tick", task="bt.tick", interval=every, args='["row"]')
"""
"""A row made through the ORM, as the admin makes it: every second, with one argument."""


@pytest.mark.slow
def test_django_line_migrates_a_project_and_a_worker_runs_its_row_through_the_bridge(
    installed: Callable[[str], Path], project: Callable[[Path], Project], redis_client: Any
) -> None:
    nodes = project(installed(DJANGO))
    (nodes.directory / "bt_django_settings.py").write_text(DJANGO_SETTINGS)
    env = celery_env(nodes, REDIS_URL, store=None) | {
        "BT_DJANGO": "1",
        "DJANGO_SETTINGS_MODULE": "bt_django_settings",
        "BT_SQLITE": str(nodes.directory / "rows.db"),
    }
    for command in (["django-admin", "migrate"], ["python", "-c", DJANGO_ROW]):
        done = nodes.run(command, env)
        assert done.returncode == 0, done.stdout + done.stderr
    start_celery(nodes, env, ("one",))
    try:
        wait_until(lambda: len(read_runs(redis_client, nodes.prefix)) >= 3, 90, "3 runs", nodes)
    finally:
        nodes.stop_all()
    fleet = ["--celery", "bt_celery:app", "--json"]
    got = nodes.run(["beatless", "schedule", "get", "tick", *fleet], env)
    assert got.returncode == 0, got.stdout + got.stderr
    history = nodes.run(["beatless", "schedule", "history", "tick", *fleet], env)
    assert history.returncode == 0, history.stdout + history.stderr

    entry, (revision, *_) = json.loads(got.stdout), json.loads(history.stdout)
    runs = read_runs(redis_client, nodes.prefix)
    address = f"{nodes.prefix}/tick"
    assert (entry["task"], entry["args"]) == ("bt.tick", ["row"]), entry
    assert revision["writer"] == "django-celery-beat", revision
    assert all(r["id"] == firing_id(address, r["occurrence_ms"]) for r in runs), runs
    assert len({r["occurrence_ms"] for r in runs}) == len(runs), runs
    assert {(r["name"], tuple(r["args"])) for r in runs} == {("tick", ("row",))}, runs
    assert "Traceback" not in nodes.logs(), nodes.logs()


SOLAR_SCHEDULE = """
namespace = "garden"

[[entry]]
name = "lights-on"
task = "garden.lights"
solar = "sunset"
lat = 52.52
lon = 13.405
"""

SOLAR_TRIGGER = """
from datetime import UTC, datetime

from beatless import Solar

sunset = Solar("sunset", 52.52, 13.405)
after = datetime(2026, 6, 20, tzinfo=UTC)
occurrence = next(iter(sunset.after(int(after.timestamp() * 1000))))
print(occurrence, sunset.key(occurrence))
"""


@pytest.mark.slow
def test_solar_line_computes_the_next_sunset_in_python_and_with_beatless_next(
    installed: Callable[[str], Path], tmp_path: Path
) -> None:
    from beatless import Entry, Firing, Solar

    venv = installed(SOLAR)
    (tmp_path / "garden.toml").write_text(SOLAR_SCHEDULE)

    def run(*command: str) -> str:
        done = subprocess.run(
            [str(venv / "bin" / command[0]), *command[1:]],
            cwd=tmp_path,
            env=venv_environment(venv),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    occurrence, key = run("python", "-c", SOLAR_TRIGGER).split()
    listed = run("beatless", "next", "garden.toml", "--after", "2026-06-20T00:00:00Z", "--json")
    first = json.loads(listed.splitlines()[0])
    lights = Entry(name="lights-on", task="garden.lights", trigger=Solar("sunset", 52.52, 13.405))
    expected = Firing.of(lights, None, "garden/lights-on", int(occurrence))

    assert key == "sunset/2026-06-20"
    # Berlin's sunset on 20 June 2026 is at 21:33 CEST
    assert "2026-06-20T19:32:00Z" < first["occurrence"] < "2026-06-20T19:34:00Z", first
    assert first["occurrence"] == iso(int(occurrence)), (first, occurrence)
    assert first["id"] == expected.id, (first, expected)


REDBEAT_APP = """
import os

from celery import Celery

PREFIX = os.environ["BT_PREFIX"]
app = Celery(PREFIX, broker=os.environ["BT_BROKER"])
app.conf.update(
    timezone="UTC",
    beatless_namespace=PREFIX,
    redbeat_redis_url=os.environ["BT_BROKER"],
    redbeat_key_prefix=PREFIX + ":redbeat:",
)
"""
"""A user's Celery app that ran RedBeat, its entries under a prefix of the test's own."""

REDBEAT_WRITE = """
from datetime import UTC, datetime

from celery.schedules import crontab, schedule
from redbeat import RedBeatSchedulerEntry

from bt_redbeat import app

last = datetime(2026, 3, 20, 9, 13, 7, tzinfo=UTC)
RedBeatSchedulerEntry("report", "proj.report", crontab(minute=0, hour=4), args=["daily"],
                      app=app, last_run_at=last).save()
RedBeatSchedulerEntry("sync", "proj.sync", schedule(90), app=app, last_run_at=last).save()
"""
"""Two entries written as RedBeat's users write them."""


@pytest.mark.slow
def test_redbeat_line_plans_the_import_of_entries_redbeat_saved(
    installed: Callable[[str], Path], project: Callable[[Path], Project], redis_client: Any
) -> None:
    nodes = project(installed(REDBEAT))
    (nodes.directory / "bt_redbeat.py").write_text(REDBEAT_APP)
    env = {"BT_PREFIX": nodes.prefix, "BT_BROKER": REDIS_URL}
    wrote = nodes.run(["python", "-c", REDBEAT_WRITE], env)
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    saved = set(redis_client.scan_iter(match=f"{nodes.prefix}:*"))
    source = REDIS_URL.replace("redis://", "redbeat://")
    command = ["beatless", "schedule", "import", "--from", source, "--celery", "bt_redbeat:app"]
    planned = nodes.run([*command, "--dry-run"], env)

    said = planned.stdout + planned.stderr
    assert planned.returncode == 0, said
    assert f"prefix '{nodes.prefix}:redbeat:': 2 entries read" in said, said
    assert "+ report" in said, said
    assert "+ sync" in said, said
    assert "dry run: nothing written" in said, said
    assert set(redis_client.scan_iter(match=f"{nodes.prefix}:*")) == saved  # read, not changed


# -- the demo --------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_line_installs_and_runs_the_demo_without_duplicates_or_misses(tmp_path: Path) -> None:
    clone = tmp_path / "beatless"
    shutil.copytree(ROOT, clone, ignore=COPY_IGNORE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    output = run_line(DEMO, clone, env, INSTALL_TIMEOUT_S)
    assert re.search(r"duplicates\s+0\b", output), output[-3_000:]
