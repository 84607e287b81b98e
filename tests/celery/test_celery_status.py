"""``celery -A proj beatless status``: the sub-command Celery finds through its entry
point, reading the registry and history of real worker nodes with the app's own store
and namespace."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from conftest import CeleryProject

pytestmark = pytest.mark.slow


def celery_status(project: CeleryProject, *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "bt_app", "beatless", "status", *args],
        cwd=project.dir,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def test_celery_beatless_status_shows_the_workers_and_what_they_sent(
    project: CeleryProject, redis_client: Any
) -> None:
    project.configure({"tick": {"task": "beatless_test.record", "schedule": 1.0}})
    workers = [project.worker(name, "-P", "solo", install=True) for name in ("w1", "w2")]
    seen: dict[str, Any] = {}

    def healthy() -> bool:
        code, out, _ = celery_status(project, "--json")
        if code == 0 and out:
            seen.update(json.loads(out))
        return code == 0 and len(seen.get("nodes", [])) == 2 and seen["entries"][0]["last"]

    try:
        told = "\n".join(w.output() for w in workers)
        assert project.wait_for(healthy, 60, interval=1.0), (seen, told)
        assert {n["framework"] for n in seen["nodes"]} == {"celery"}
        assert all(n["node"].split("@")[0] in ("w1", "w2") for n in seen["nodes"]), seen
        (tick,) = seen["entries"]
        assert tick["entry"] == "tick"
        assert tick["last"]["outcome"] in ("won", "takeover")
        assert seen["problems"] == []

        code, text, _ = celery_status(project)
        assert code == 0
        assert "no problems" in text

        code, _, error = celery_status(project, "--store", "nosuch://x")
        assert code == 2
        assert "celery beatless status: error:" in error
    finally:
        project.stop_all()


def test_celery_inspect_beatless_asks_each_worker_how_its_scheduler_is(
    project: CeleryProject, redis_client: Any
) -> None:
    project.configure(
        {"tick": {"task": "beatless_test.record", "schedule": 1.0}},
        worker_enable_remote_control=True,
    )
    scheduling = project.worker("w1", "-P", "solo", install=True)
    consuming = project.worker("w2", "-P", "solo", "--without-beatless", install=True)
    answers: dict[str, Any] = {}

    def answered() -> bool:
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "bt_app", "inspect", "beatless", "--json"],
            cwd=project.dir,
            env=project.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            answers.update(json.loads(done.stdout))
        ready = [a for a in answers.values() if a.get("last_wake_ms")]
        return len(answers) == 2 and len(ready) == 1

    try:
        told = "\n".join(w.output() for w in (scheduling, consuming))
        assert project.wait_for(answered, 60, interval=1.0), (answers, told)
        by_worker = {name.split("@")[0]: answer for name, answer in answers.items()}
        assert by_worker["w1"]["scheduling"] is True
        assert by_worker["w1"]["health"] == "ok"
        assert by_worker["w1"]["loop_alive"] is True
        assert by_worker["w1"]["framework"] == "celery"
        assert by_worker["w2"] == {
            "scheduling": False,
            "health": "no beatless scheduler on this worker",
        }
    finally:
        project.stop_all()
