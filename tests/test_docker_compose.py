"""docker-compose.yml: Redis and three workers of the Celery example, and no beat.

No Docker engine runs the tests: the file is parsed, and what it names is checked
against the repository (the app module imports, the celery command line parses).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test dependency group")

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ("worker1", "worker2", "worker3")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with (ROOT / "docker-compose.yml").open(encoding="utf-8") as f:
        loaded = yaml.safe_load(f)
    assert isinstance(loaded, dict)
    return loaded


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


def test_compose_runs_redis_and_three_workers_and_nothing_else(compose: dict[str, Any]) -> None:
    assert set(services(compose)) == {"redis", *WORKERS}
    assert services(compose)["redis"]["image"].startswith("redis:")


def test_no_service_runs_celery_beat(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        command = [str(part) for part in service.get("command") or []]
        assert "beat" not in name
        assert "beat" not in command, f"service {name!r} runs celery beat"


def test_each_worker_runs_the_example_app_on_the_compose_redis(compose: dict[str, Any]) -> None:
    names = set()
    for name in WORKERS:
        service = services(compose)[name]
        command = service["command"]
        assert command[:4] == ["celery", "-A", "integrations.celery_redis.app", "worker"]
        names.add(command[command.index("-n") + 1])
        env = service["environment"]
        assert env["BEATLESS_DEMO_BROKER"].startswith("redis://redis:")
        assert env["PYTHONPATH"] == service["working_dir"] == "/app"
        assert ".:/app:ro" in service["volumes"]
        assert "redis" in service["depends_on"]
    assert len(names) == len(WORKERS), "each worker needs a node name of its own"


def test_the_app_the_workers_name_imports_and_installs_beatless(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery import Celery

    from beatless.celery import BeatlessStep

    monkeypatch.syspath_prepend(str(ROOT))
    module = importlib.import_module("integrations.celery_redis.app")
    assert isinstance(module.app, Celery)
    assert BeatlessStep in module.app.steps["worker"]
    assert module.app.conf.beat_schedule, "the example has a beat_schedule"


def test_the_workers_command_line_is_one_celery_accepts(compose: dict[str, Any]) -> None:
    """``celery ... worker <flags> --help`` parses every flag (an unknown one fails)."""
    command = services(compose)["worker1"]["command"]
    assert command[0] == "celery"
    done = subprocess.run(
        [sys.executable, "-m", "celery", *command[1:], "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--without-beatless" in done.stdout, "beatless.celery.install(app) adds this flag"


def test_an_unknown_worker_flag_would_be_caught() -> None:
    command = ["celery", "-A", "integrations.celery_redis.app", "worker", "--no-such-flag"]
    done = subprocess.run(
        [sys.executable, "-m", *command, "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
