"""docker-compose.yml: Redis and three workers of the Celery example, and no beat,
shaped as a production deployment.

No Docker engine runs the tests: the file and integrations/Dockerfile are parsed, and
what they name is checked against the repository (the app module imports, the celery
command line parses, the extras exist, the worker's healthcheck judges a real metrics
exposition).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tomllib
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
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["build"]["dockerfile"] == "integrations/Dockerfile"
    assert len(names) == len(WORKERS), "each worker needs a node name of its own"


def test_nothing_is_installed_or_mounted_when_a_container_starts(
    compose: dict[str, Any],
) -> None:
    for name, service in services(compose).items():
        started = [*(service.get("entrypoint") or []), *(service.get("command") or [])]
        assert not any("pip" in str(part) for part in started), f"{name} installs at start"
        for volume in service.get("volumes") or []:
            assert not str(volume).startswith("."), f"{name} mounts the repository: {volume}"
        assert "PYTHONPATH" not in (service.get("environment") or {}), name


def test_the_image_installs_beatless_as_a_wheel_with_the_extras_the_workers_need() -> None:
    text = (ROOT / "integrations" / "Dockerfile").read_text(encoding="utf-8")
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert len(stages) == 2, "a stage that builds the wheel, one that installs it"
    build, final = stages
    assert "pip wheel" in build
    install = re.search(r"beatless-\*\.whl\)\[([a-z,]+)\]", final)
    assert install is not None, "the final stage installs the wheel with its extras"
    extras = set(install.group(1).split(","))
    assert {"celery", "redis", "metrics"} <= extras
    with (ROOT / "pyproject.toml").open("rb") as f:
        declared = tomllib.load(f)["project"]["optional-dependencies"]
    assert extras <= set(declared)
    copied = re.findall(r"^COPY (?!--from)(\S+)", final, flags=re.MULTILINE)
    assert copied == ["integrations"], "the final stage holds no copy of beatless/"
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert "*" in ignored
    assert {"!pyproject.toml", "!README.md", "!beatless/", "!integrations/"} <= set(ignored)


def test_redis_keeps_the_claims_across_a_restart_and_never_evicts_one(
    compose: dict[str, Any],
) -> None:
    redis = services(compose)["redis"]
    command = [str(part) for part in redis["command"]]
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    (volume,) = redis["volumes"]
    assert volume.endswith(":/data")
    assert volume.split(":")[0] in compose["volumes"]


def test_every_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        check = service.get("healthcheck") or {}
        assert check.get("test"), f"service {name!r} has no healthcheck"
    assert services(compose)["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_each_worker_serves_its_metrics_where_its_healthcheck_reads_them(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = services(compose)["worker1"]["environment"]
    port = env["BEATLESS_DEMO_METRICS_PORT"]
    assert f"http://127.0.0.1:{port}/metrics" in healthcheck_code(compose)
    assert env["BEATLESS_DEMO_METRICS_HOST"] == "0.0.0.0"  # noqa: S104 - scraped from the network

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delitem(sys.modules, "integrations.celery_redis.app", raising=False)
    app = importlib.import_module("integrations.celery_redis.app").app
    monkeypatch.delitem(sys.modules, "integrations.celery_redis.app")
    assert str(app.conf.beatless_metrics_port) == port
    assert app.conf.beatless_metrics_host == env["BEATLESS_DEMO_METRICS_HOST"]


@pytest.mark.parametrize(("alive", "healthy"), [(1, True), (0, False)])
def test_the_worker_healthcheck_passes_only_while_the_scheduler_loop_is_alive(
    compose: dict[str, Any], alive: int, healthy: bool
) -> None:
    prometheus = pytest.importorskip("prometheus_client", reason="the metrics extra")
    registry = prometheus.CollectorRegistry()
    gauge = prometheus.Gauge(
        "beatless_loop_alive", "alive", ["namespace", "node"], registry=registry
    )
    gauge.labels("demo", "worker1@worker1:7").set(alive)
    server, thread = prometheus.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        code = healthcheck_code(compose).replace(
            "127.0.0.1:9808", f"127.0.0.1:{server.server_port}"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert (done.returncode == 0) is healthy, done.stderr


def healthcheck_code(compose: dict[str, Any]) -> str:
    test = services(compose)["worker1"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    return str(test[3])


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
