"""One ``celery`` command in a process group of its own, stopped by its pid: the worker
processes of the Celery and django-celery-beat integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

READY = " ready."
"""Celery's line once a worker has started every bootstep (beatless's among them) and
consumes: ``n1@host ready.``"""


@dataclass
class CeleryProcess:
    """One ``celery`` command in its own process group, stopped by pid."""

    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)
    killed: bool = field(default=False, init=False)

    def start(self, env: dict[str, str], cwd: Path) -> CeleryProcess:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", *self.args],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        """Warm shutdown (SIGTERM), then SIGKILL of the process group if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the process group, once: later, its number may be another group's."""
        if self.killed:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(5)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def is_ready(self) -> bool:
        """Whether the worker said it is ready (its log, at INFO)."""
        return self.log.exists() and READY in self.output()
