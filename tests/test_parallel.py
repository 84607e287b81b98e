"""The suite's parallel run keeps its promises: serial tests on one worker, ports apart.

``python -m pytest -n auto --dist loadgroup`` (the README's command) relies on
pytest-xdist sending every test of one ``xdist_group`` to one worker; a release of
pytest or pytest-xdist that stops grouping does so silently (pytest-xdist#1386), and the
timing tests would then run beside each other. The first test runs a few of them in a
parallel session of their own and checks where each ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ports import FIRST, SLICE, SLICES, free_port, process_slice

ROOT = Path(__file__).resolve().parents[1]
SERIAL_TESTS = [
    "tests/celery/test_celery_sending.py::test_a_shorter_timeout_of_the_app_is_kept",
    "tests/celery/test_celery_sending.py::test_a_message_that_cannot_be_encoded_fails_alone_and_leaves_the_broker_usable",
    "tests/dramatiq/test_dramatiq_sending.py::test_a_broker_beatless_cannot_bound_is_sent_to_as_it_is",
]
OTHER_TESTS = ["tests/test_durations.py"]


def test_the_serial_tests_run_on_one_worker_one_after_another(tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is in the test dependency group")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    command = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v"]
    command += ["-p", "no:cacheprovider", "--basetemp", str(tmp_path / "run")]
    done = subprocess.run(
        [*command, *SERIAL_TESTS, *OTHER_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3_000:] + done.stderr[-3_000:]
    ran = re.findall(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", done.stdout, re.MULTILINE)
    serial = {nodeid: worker for worker, nodeid in ran if nodeid.split("@")[0] in SERIAL_TESTS}
    assert len(serial) == len(SERIAL_TESTS), done.stdout[-3_000:]
    assert all(nodeid.endswith("@serial") for nodeid in serial), (
        "pytest-xdist did not group the serial tests: is pytest newer than pytest-xdist "
        f"supports? {sorted(serial)}"
    )
    assert len(set(serial.values())) == 1, f"serial tests ran on several workers: {serial}"
    assert len({worker for worker, _ in ran}) == 2, "the other tests did not run in parallel"


@pytest.mark.parametrize(("worker", "first"), [("", FIRST), ("gw0", FIRST + SLICE)])
def test_each_worker_hands_out_ports_of_its_own_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch, worker: str, first: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert process_slice() == range(first, first + SLICE)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{SLICES - 1}")
    assert process_slice() == range(FIRST, FIRST + SLICE)  # wraps around past the last
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if ephemeral.exists():
        assert int(ephemeral.read_text().split()[0]) >= FIRST + SLICES * SLICE


def test_a_port_is_not_handed_out_twice_until_the_slice_is_used_up() -> None:
    ports = process_slice()
    handed = [free_port() for _ in range(50)]
    assert len(set(handed)) == 50
    assert all(port in ports for port in handed)
