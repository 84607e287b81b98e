"""A schedule of 2,000 entries is checked as it always was: the same problems, word for
word, and for a sound one the same fingerprint and the same output.

The expected texts were written by ``beatless check`` before start-up was made fast for
big schedules (parsed crons and gaps kept, bound crons shared, lazy occurrences), from
the very files these tests write; ``tests/data/big_check_problems.txt`` holds the
problems. Regenerate them only for a change that means to alter what check says.
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import pytest

from beatless.cli.command import main
from beatless.cli.loader import load_schedule

DATA = Path(__file__).resolve().parent / "data"
ENTRIES = 2_000
SOUND_FINGERPRINT = "0876d087fda285e9"
ZONES = ("Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Tokyo", "UTC")
MINUTES = ("0", "15", "7,37", "*/5", "*/10", "0-50/10", "5,25,45", "59")
HOURS = ("*", "2", "1,3", "9-17", "*/2", "0,12", "1-3")
DAYS = ("* * *", "* * 1-5", "1 * *", "L * *", "* * SAT", "15W * *", "* */3 *", "* * 2#1")
PROBLEMS = (
    # Each is one entry's keys beside name and task: a rule broken, or a value refused.
    # The first breaks rule 6 only across a change of offset (01:59 to 03:59 is an hour).
    'cron = "59 1,3 * * *"\ntimezone = "Europe/Berlin"\njitter = "40m"\nmax_late = "2h"',
    'cron = "30 2 * * *"\ntimezone = "America/New_York"\njitter = "12h"\nmax_late = "13h"',
    'cron = "*/5 * * * *"\njitter = "150s"\nmax_late = "5m"',
    'cron = "0,30 * * * *"\njitter = "20m"\nmax_late = "10m"',
    'every = "30s"\njitter = "15s"',
    'every = "1m"\njitter = "-1s"',
    'cron = "61 * * * *"',
    'cron = "0 2 * * *"\ntimezone = "Mars/Olympus"',
    'every = "5m"\noverlap = "buffer_one"',
    'every = "5m"\ncatch_up = "sometimes"\nheartbeat = "40s"',
    'every = "5m"\njiter = "5s"',
    'cron = "0 9 * * *"\nstart_at = "2030-01-02T00:00:00Z"\nend_at = "2030-01-01T00:00:00Z"',
)


def write_schedule(path: Path, *, problems: bool) -> None:
    """``ENTRIES`` entries, the same on every run: crons of many shapes and zones, some
    intervals, and with ``problems`` one of :data:`PROBLEMS` every 50 entries and a
    name used twice."""
    rng = random.Random(f"big-{problems}")
    lines = ['namespace = "big"', 'timezone = "Europe/Berlin"', 'max_late = "2m"', ""]
    for i in range(ENTRIES):
        name = "cron-7" if problems and i == 1_500 else f"cron-{i}"
        lines += ["[[entry]]", f'name = "{name}"', f'task = "jobs.t{i % 13}"']
        if problems and i % 50 == 25:
            lines += PROBLEMS[(i // 50) % len(PROBLEMS)].splitlines()
        elif i % 10 == 0:
            lines += [f'every = "{rng.choice(("30s", "5m", "1h"))}"', 'jitter = "10s"']
        else:
            lines.append(f'cron = "{rng.choice(MINUTES)} {rng.choice(HOURS)} {rng.choice(DAYS)}"')
            if rng.random() < 0.4:
                lines.append(f'timezone = "{rng.choice(ZONES)}"')
            jitters = (0, 5, 30, 60) if problems else (0, 5, 20, 25)  # sound: under 30s
            lines.append(f'jitter = "{rng.choice(jitters)}s"')
        lines += [f"args = [{i}]", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def checked(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``beatless check PATH``: its exit code and what it printed, the file named as the
    recording named it and the tzdata version left out."""
    code = main(["check", str(path)])
    out, err = (text.replace(str(path), path.name) for text in capsys.readouterr())
    return code, re.sub(r"tzdata \S+", "tzdata <version>", out), err


def test_the_problems_of_a_big_schedule_are_those_check_always_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "problems.toml"
    write_schedule(path, problems=True)

    code, out, err = checked(path, capsys)

    assert code == 1
    assert out == ""
    expected = (DATA / "big_check_problems.txt").read_text(encoding="utf-8")
    assert err == expected
    assert err.count("\n  entry ") == 49  # every problem, none stopped at the first


def test_a_big_sound_schedule_is_checked_with_the_same_fingerprint_and_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sound.toml"
    write_schedule(path, problems=False)

    code, out, err = checked(path, capsys)

    assert code == 0
    assert load_schedule(str(path)).fingerprint == SOUND_FINGERPRINT
    assert f"schedule fingerprint {SOUND_FINGERPRINT}" in out
    assert len(out.splitlines()) == ENTRIES + 3  # the summary, two lines, the table's head
    assert hashlib.sha256(out.encode()).hexdigest() == SOUND_OUTPUT_SHA256
    assert err == SOUND_STDERR


SOUND_OUTPUT_SHA256 = "36ad74088cbb511fc37b62acc43d8fc4bf3d1902b89a602dc5e2666e6b573bb9"
"""Of the 2,003 lines ``check`` printed of the sound schedule before (the table lists
every entry with its trigger, jitter and policies)."""
SOUND_STDERR = ""
