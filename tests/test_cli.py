"""The ``beatless`` command line: next, check, explain, run and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from service_check import require_service
from stores import PrivateRedis, free_port

from beatless import __version__, stores
from beatless.cli.command import main
from beatless.stores import MemoryStore

SCHEDULE = """
namespace = "shop"
max_late = "5m"

[[entry]]
name = "heartbeat"
task = "ops.heartbeat"
every = "30s"

[[entry]]
name = "nightly"
task = "reports.nightly"
cron = "0 2 * * *"
jitter = "2m"
tenants = ["acme", "globex", "initech"]
"""


@pytest.fixture
def schedule_file(tmp_path: Path) -> str:
    path = tmp_path / "schedule.toml"
    path.write_text(SCHEDULE)
    return str(path)


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beatless", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def ms(iso_z: str) -> int:
    return int(datetime.fromisoformat(iso_z).timestamp() * 1000)


# -- next -------------------------------------------------------------------------------


def test_next_json_has_one_object_per_firing_with_the_documented_fields(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["next", schedule_file, "--count", "2", "--after", "2026-11-29T01:59:00Z", "--json"]
    )
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines]
    assert code == 0
    assert len(rows) == 2 + 2  # two heartbeats, and the two nightly firings released first
    assert all(
        set(r)
        == {
            *("entry", "tenant", "address", "occurrence", "id", "offset_ms", "release"),
            *("catch_up", "overlap", "once_only", "run_lease_ms", "heartbeat_ms"),
        }
        for r in rows
    )
    heartbeat = rows[0]
    assert heartbeat == {
        "entry": "heartbeat",
        "tenant": None,
        "address": "shop/heartbeat",
        "occurrence": "2026-11-29T01:59:30.000Z",
        "id": str(uuid.UUID(bytes=hashlib.sha256(b"shop/heartbeat@1795917570000").digest()[:16])),
        "offset_ms": 0,
        "release": "2026-11-29T01:59:30.000Z",
        "catch_up": "latest",
        "overlap": "allow",
        "once_only": True,
        "run_lease_ms": 30_000,
        "heartbeat_ms": 5_000,
    }
    nightly = [r for r in rows if r["entry"] == "nightly"]
    assert len({r["tenant"] for r in nightly}) == 2
    assert {r["tenant"] for r in nightly} < {"acme", "globex", "initech"}
    assert {r["occurrence"] for r in nightly} == {"2026-11-29T02:00:00.000Z"}
    for row in nightly:
        assert row["address"] == f"shop/nightly/{row['tenant']}"
        assert ms(row["release"]) == ms(row["occurrence"]) + row["offset_ms"]
        assert 0 <= row["offset_ms"] < 120_000


def test_next_is_sorted_by_release_not_by_occurrence(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "next",
            schedule_file,
            "--entry",
            "nightly",
            "--count",
            "9",
            "--json",
            "--after",
            "2026-11-29T00:00:00Z",
        ]
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    releases = [ms(r["release"]) for r in rows]
    assert releases == sorted(releases)
    # within one night the jitter reorders the tenants, so occurrence order alone is not it
    assert len(rows) == 9  # three nights of three tenants
    assert all(r["entry"] == "nightly" for r in rows)


def test_next_after_an_instant_lists_only_occurrences_strictly_after_it(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "next",
            schedule_file,
            "--entry",
            "heartbeat",
            "--count",
            "1",
            "--json",
            "--after",
            "2026-11-29T02:00:00Z",
        ]
    )
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["occurrence"] == "2026-11-29T02:00:30.000Z"


def test_next_without_json_prints_an_aligned_table(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["next", schedule_file, "--count", "1", "--after", "2026-11-29T01:59:00Z"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["release", "occurrence", "offset", "address", "id", "policies"]
    column = lines[0].index("address")
    assert all(line[column:].startswith("shop/") for line in lines[1:])
    policies = lines[0].index("policies")
    assert all(line[policies:] == "catch_up latest, overlap allow, once-only" for line in lines[1:])


# -- check ------------------------------------------------------------------------------


def test_check_exits_0_with_a_summary_for_a_sound_schedule(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", schedule_file]) == 0
    out = capsys.readouterr().out
    assert "sound" in out
    assert "2 entries, 4 addresses" in out


def test_check_warns_when_the_peak_load_exceeds_what_one_node_sends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "busy.toml"
    tenants = ", ".join(f'"t{i}"' for i in range(30_000))
    calm = ", ".join(f'"t{i}"' for i in range(3_000))
    path.write_text(
        f'[[entry]]\nname = "busy"\ntask = "t"\nevery = "1m"\njitter = "2s"\n'
        f"tenants = [{tenants}]\n"
        f'[[entry]]\nname = "calm"\ntask = "t"\nevery = "1m"\njitter = "20s"\n'
        f"tenants = [{calm}]\n"
    )
    assert main(["check", str(path)]) == 0
    err = capsys.readouterr().err
    assert "up to 15,150 firings per second at peak (most from entry 'busy')" in err
    path.write_text(f'[[entry]]\nname = "calm"\ntask = "t"\nevery = "1m"\ntenants = [{calm}]\n')
    assert main(["check", str(path)]) == 0
    assert "firings per second" not in capsys.readouterr().err


def test_check_exits_1_and_prints_each_problem_on_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        textwrap.dedent(
            """
            [[entry]]
            name = "a"
            task = "t"
            every = "2s"
            jitter = "1s"
            max_late = "10s"
            [[entry]]
            name = "b"
            task = "t"
            cron = "0 25 * * *"
            """
        )
    )
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("2 problem(s)")
    assert "entry 'b'" in err[1]
    assert "bad hour" in err[1]
    assert "entry 'a'" in err[2]
    assert "half the shortest gap" in err[2]


def test_check_with_a_store_passes_a_store_that_keeps_each_claim_as_long_as_asked(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", schedule_file, "--store", "memory://"]) == 0
    assert "sound" in capsys.readouterr().out


class ForgetfulStore(MemoryStore):
    """A store that forgets every claim after a fixed 90 s window."""

    name = "forgetful"

    @property
    def remembers(self) -> timedelta:
        return timedelta(seconds=90)


def test_check_with_a_store_refuses_entries_the_store_forgets_too_soon(
    schedule_file: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stores, "open_store", lambda url, namespace: ForgetfulStore())
    assert main(["check", schedule_file, "--store", "forgetful://"]) == 1
    err = capsys.readouterr().err
    # heartbeat: 0 + 5m + 10s, nightly: 2m + 5m + 10s, both over 90 s
    assert "entry 'heartbeat'" in err
    assert "entry 'nightly'" in err
    assert "forgetful remembers (1m30s)" in err


def test_check_of_an_unreadable_target_exits_2(tmp_path: Path) -> None:
    assert main(["check", str(tmp_path / "absent.toml")]) == 2


def test_check_with_a_store_probes_it_and_prints_the_clock_offset(
    schedule_file: str, tmp_path: Path
) -> None:
    pytest.importorskip("redis")
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        result = run_cli("check", schedule_file, "--store", server.url)
    finally:
        server.stop()

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "sound" in lines[0]
    assert "redis store keeps each claim as long as it asks" in lines[0]
    assert lines[1].startswith("  schedule fingerprint ")
    assert lines[2].startswith("clock offset to the store: ")
    offset_ms = int(lines[2].split(": ")[1].split(" ms")[0])
    assert abs(offset_ms) < 1_000
    assert result.stderr == ""


def test_check_warns_when_the_store_clock_is_over_a_second_away(
    schedule_file: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead = MemoryStore(clock=lambda: time.time() + 2.5)
    monkeypatch.setattr(stores, "open_store", lambda url, namespace: ahead)

    assert main(["check", schedule_file, "--store", "memory://"]) == 0

    captured = capsys.readouterr()
    (line,) = [li for li in captured.out.splitlines() if li.startswith("clock offset")]
    assert 2_400 < int(line.split(": ")[1].split(" ms")[0]) < 2_600
    (warning,) = captured.err.splitlines()
    assert warning.startswith("warning: this host's clock is 2.5 s behind the store's")


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.serial
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_store_that_cannot_be_reached_exits_2_with_one_line(
    schedule_file: str, command: str
) -> None:
    pytest.importorskip("redis")
    started = time.monotonic()

    result = run_cli(command, schedule_file, "--store", f"redis://127.0.0.1:{free_port()}/0")

    took = time.monotonic() - started
    assert_one_line_exit_2(result, "cannot probe")
    assert result.stdout == ""
    if command == "run":  # tried again for 5 s before giving up
        assert "tried for 5 s" in result.stderr
        assert 5 <= took < 15
    else:
        assert took < 5


@pytest.mark.serial
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_wrong_password_exits_2_at_once_with_one_line_that_does_not_show_it(
    schedule_file: str, tmp_path: Path, command: str
) -> None:
    pytest.importorskip("redis")
    server = PrivateRedis(tmp_path, password="the-right-one-9")  # noqa: S106 - a test server
    server.start()
    started = time.monotonic()
    try:
        url = f"redis://:not-it-31@127.0.0.1:{server.port}/0"
        result = run_cli(command, schedule_file, "--store", url)
    finally:
        server.stop()

    assert_one_line_exit_2(result, "check the user name and password")
    assert "not-it-31" not in result.stderr
    assert time.monotonic() - started < 5


# -- explain ----------------------------------------------------------------------------


def test_explain_shows_numbers_an_operator_can_recompute_with_hashlib(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["explain", schedule_file, "nightly", "--at", "2026-11-29T02:00:00Z", "--tenant", "globex"]
    )
    out = capsys.readouterr().out
    assert code == 0
    occurrence_ms = 1795917600000
    text = f"shop/nightly/globex@{occurrence_ms}"
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    lead53 = int.from_bytes(digest[:8], "big") >> 11
    offset = (120_000 * lead53) >> 53
    release_ms = occurrence_ms + offset
    release = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=release_ms)
    release_iso = release.isoformat(timespec="milliseconds")
    assert f'"{text}"' in out
    assert digest.hex() in out
    assert str(uuid.UUID(bytes=digest[:16])) in out
    assert f"= {lead53}" in out
    assert f"(120000 × {lead53}) >> 53 = {offset}" in out
    assert f"= {release_ms}" in out
    assert release_iso.replace("+00:00", "Z") in out


def test_explain_and_check_show_the_catch_up_policy(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["explain", schedule_file, "nightly", "--at", "2026-11-29T02:00:00Z", "--tenant", "globex"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "  catch_up    'latest': by a node that starts after it, claimed only if it is" in out
    assert main(["check", schedule_file]) == 0
    table = capsys.readouterr().out
    assert "catch_up" in table
    assert "latest" in table


def test_explain_of_an_instant_that_is_no_occurrence_names_the_nearest_ones(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["explain", schedule_file, "heartbeat", "--at", "2026-11-29T02:00:10Z"])
    out = capsys.readouterr().out
    assert code == 1
    assert "is not an occurrence of entry 'heartbeat'" in out
    assert "nearest before: 2026-11-29T02:00:00.000Z" in out
    assert "nearest after: 2026-11-29T02:00:30.000Z" in out


def test_explain_finds_the_previous_occurrence_of_a_rare_cron(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["explain", schedule_file, "nightly", "--at", "2026-11-29T13:00:00Z", "--tenant", "acme"])
    out = capsys.readouterr().out
    assert "nearest before: 2026-11-29T02:00:00.000Z" in out
    assert "nearest after: 2026-11-30T02:00:00.000Z" in out


def test_explain_of_a_fan_out_entry_without_a_tenant_is_bad_input(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", schedule_file, "nightly", "--at", "2026-11-29T02:00:00Z"]) == 2
    assert "pass --tenant" in capsys.readouterr().err


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["next", "{dir}/absent.toml"], "cannot read"),
        (["next", "{dir}/broken.toml"], "not valid TOML"),
        (["next", "{dir}/unknown.toml"], "unknown key(s) 'colour'"),
        (["next", "{dir}/badcron.toml"], "bad minute"),
        (["next", "{file}", "--after", "tomorrow"], "cannot read 'tomorrow'"),
        (["next", "{file}", "--after", "2026-11-29T02:00:00"], "has no UTC offset"),
        (["next", "{file}", "--entry", "nope"], "no entry named 'nope'"),
        (["next", "no_such_module_xyz:schedule"], "cannot import module"),
        (["explain", "{file}", "heartbeat", "--at", "someday"], "cannot read 'someday'"),
        (["run", "{file}"], "give --store URL or set BEATLESS_STORE"),
        (["run", "{file}", "--store", "carrier-pigeon://x"], "unknown store URL scheme"),
        (["next"], "give TARGET, --celery APP, --dramatiq BROKER, or --store URL"),
        (["next", "--store", "memory://"], "give --namespace NS with --store"),
    ],
)
def test_bad_input_exits_2_with_one_line_on_stderr_and_no_traceback(
    tmp_path: Path, schedule_file: str, args: list[str], message: str
) -> None:
    (tmp_path / "broken.toml").write_text("x = [\n")
    (tmp_path / "unknown.toml").write_text(
        'colour = 1\n[[entry]]\nname = "a"\ntask = "t"\nevery = 5\n'
    )
    (tmp_path / "badcron.toml").write_text(
        '[[entry]]\nname = "a"\ntask = "t"\ncron = "61 * * * *"\n'
    )
    args = [a.format(dir=tmp_path, file=schedule_file) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BEATLESS_")}
    result = subprocess.run(
        [sys.executable, "-m", "beatless", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"beatless {__version__}"


def test_module_targets_resolve_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "myschedule.py").write_text(
        "from beatless import Entry, Every\n"
        "entries = [Entry(name='a', task='t', trigger=Every(5))]\n"
    )
    result = run_cli("check", "myschedule:entries", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sound" in result.stdout


# -- check --celery and --dramatiq ------------------------------------------------------

CELERY_APP = """
from celery import Celery
from celery.schedules import crontab

app = Celery("shop", broker="redis://127.0.0.1:6379/13")
app.conf.timezone = "Europe/Berlin"
app.conf.beat_schedule = {SCHEDULE}


@app.task(name="shop.work")
def work(*args, **kwargs):
    pass
"""

SOUND_CELERY = """{
    "nightly": {"task": "shop.work", "schedule": crontab(hour=2, minute=0),
                "options": {"beatless": {"jitter": "2m", "max_late": "5m"}}},
    "poll": {"task": "shop.work", "schedule": 30.0},
}"""

BAD_CELERY = """{
    "poll": {"task": "shop.work", "schedule": 30.0},
    "odd": {"task": "shop.work", "schedule": "every day"},
    "typo": {"task": "shop.work", "schedule": 60, "options": {"beatless": {"jiter": 5}}},
    "tight": {"task": "shop.work", "schedule": 10, "options": {"beatless": {"jitter": 8}}},
    "opaque": {"task": "shop.work", "schedule": 60, "args": [object()]},
}"""

DRAMATIQ_BROKER = """
import dramatiq
from dramatiq.brokers.stub import StubBroker

import beatless.dramatiq as bd

broker = StubBroker()
broker.add_middleware(bd.Beatless(store="redis://127.0.0.1:6379/12", {OPTIONS}))
dramatiq.set_broker(broker)
"""

DRAMATIQ_ACTORS = """
import dramatiq

import beatless.dramatiq as bd
from {BROKER} import broker


@dramatiq.actor(broker=broker, periodic=bd.cron("0 2 * * *", jitter="2m", max_late="5m"))
def nightly():
    pass


@dramatiq.actor(broker=broker, periodic={SECOND})
def second(x=None):
    pass
"""


def celery_project(tmp_path: Path, schedule: str, module: str = "shop_celery") -> Path:
    (tmp_path / f"{module}.py").write_text(CELERY_APP.replace("{SCHEDULE}", schedule))
    return tmp_path


def dramatiq_project(tmp_path: Path, options: str, second: str) -> Path:
    (tmp_path / "shop_broker.py").write_text(DRAMATIQ_BROKER.replace("{OPTIONS}", options))
    actors = DRAMATIQ_ACTORS.replace("{BROKER}", "shop_broker").replace("{SECOND}", second)
    (tmp_path / "shop_actors.py").write_text(actors)
    return tmp_path


def test_check_celery_exits_0_for_a_sound_app_named_as_celery_a_names_it(tmp_path: Path) -> None:
    cwd = celery_project(tmp_path, SOUND_CELERY)
    for name in ("shop_celery:app", "shop_celery"):
        result = run_cli("check", "--celery", name, cwd=cwd)
        assert result.returncode == 0, result.stderr
        assert f"{name}: sound — 2 entries, 2 addresses, namespace 'shop'" in result.stdout
        assert "timezone Europe/Berlin" in result.stdout
        assert "cron '0 2 * * *' in Europe/Berlin" in result.stdout
        assert result.stderr == ""


def test_check_celery_finds_an_app_called_celery_too(tmp_path: Path) -> None:
    cwd = celery_project(tmp_path, SOUND_CELERY)
    (cwd / "other_celery.py").write_text("from shop_celery import app as celery\n")
    result = run_cli("check", "--celery", "other_celery", cwd=cwd)
    assert result.returncode == 0, result.stderr


def test_check_celery_exits_1_listing_every_problem_one_line_each(tmp_path: Path) -> None:
    result = run_cli(
        "check", "--celery", "shop_celery:app", cwd=celery_project(tmp_path, BAD_CELERY)
    )
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert lines[0] == "shop_celery:app: 4 problem(s)"
    named = sorted(line.strip().split(":")[0] for line in lines[1:-1])
    assert named == ["entry 'odd'", "entry 'opaque'", "entry 'tight'", "entry 'typo'"]
    assert lines[-1] == (
        "with on_schedule_error = 'consume', a node schedules the 1 other entry and leaves "
        "out 'odd', 'typo', 'opaque', 'tight'"
    )
    assert "entry 'opaque': args[0] (a object) cannot be encoded as JSON" in result.stderr
    assert result.stdout == ""


def test_check_celery_warns_of_unregistered_tasks_and_still_passes(tmp_path: Path) -> None:
    schedule = '{"elsewhere": {"task": "billing.run", "schedule": 60}}'
    result = run_cli("check", "--celery", "shop_celery:app", cwd=celery_project(tmp_path, schedule))
    assert result.returncode == 0, result.stderr
    assert "warning: entry 'elsewhere': task 'billing.run' is not registered" in result.stderr


def test_check_dramatiq_exits_0_for_a_sound_broker_and_its_actor_modules(tmp_path: Path) -> None:
    cwd = dramatiq_project(tmp_path, 'namespace="shop"', 'bd.every("30s")')
    result = run_cli("check", "--dramatiq", "shop_broker:broker", "shop_actors", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "sound — 2 entries, 2 addresses, namespace 'shop'" in result.stdout
    same = run_cli("check", "--dramatiq", "shop_broker", "shop_actors", cwd=cwd)  # global broker
    assert same.returncode == 0, same.stderr
    assert "sound — 2 entries" in same.stdout


def test_check_dramatiq_exits_1_listing_every_problem_one_line_each(tmp_path: Path) -> None:
    second = '[bd.cron("61 * * * *", name="typo"), bd.every("10s", jitter="6s", args=[object()])]'
    cwd = dramatiq_project(tmp_path, "", second)
    result = run_cli("check", "--dramatiq", "shop_broker", "shop_actors", cwd=cwd)
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert lines[0] == "shop_broker shop_actors: 4 problem(s)"
    problems = [line.strip() for line in lines[1:]]
    assert problems[0].startswith("Beatless: namespace is required")
    assert "entry 'second': args[0] (a object) cannot be encoded" in result.stderr
    assert "entry 'typo': cron '61 * * * *'" in result.stderr
    assert "entry 'second': jitter 6s must be under half" in result.stderr
    assert len(problems) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "--celery", "no_such_module_xyz:app"], "cannot load the Celery app"),
        (["check", "--celery", "shop_celery:nothing"], "cannot load the Celery app"),
        (["check", "--dramatiq", "no_such_module_xyz:broker"], "cannot load the Dramatiq broker"),
        (["check", "--dramatiq", "plain_broker:broker"], "has 0 Beatless middleware"),
        (["check", "{file}", "--celery", "shop_celery:app"], "give one of TARGET, --celery"),
        (["check"], "give one of TARGET, --celery"),
        (["check", "--celery", "a:b", "--dramatiq", "c:d"], "not allowed with argument"),
    ],
)
def test_check_of_an_app_or_broker_that_cannot_be_loaded_exits_2_with_one_line(
    tmp_path: Path, schedule_file: str, args: list[str], message: str
) -> None:
    cwd = celery_project(tmp_path, SOUND_CELERY)
    (cwd / "plain_broker.py").write_text(
        "from dramatiq.brokers.stub import StubBroker\nbroker = StubBroker()\n"
    )
    result = run_cli(*[a.format(file=schedule_file) for a in args], cwd=cwd)
    assert result.returncode == 2, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


# -- run --------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_enqueues_through_the_log_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text('[[entry]]\nname = "tick"\ntask = "demo.tick"\nevery = 1\n')
    env = {
        **os.environ,
        "BEATLESS_STORE": f"sqlite:///{tmp_path.as_posix()}/claims.db",
        "BEATLESS_NODE": "node-from-env",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "beatless", "run", str(tmp_path / "s.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(3.5)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "node-from-env" in err
    assert "task=demo.tick" in err
    assert "outcome=won" in err
    assert "Traceback" not in err


# -- one key space per fleet: every command by --store URL --namespace NS ----------------

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def keyed_namespace() -> Iterator[str]:
    """A namespace of this test alone on Redis database 0; its keys go at the end."""
    redis = pytest.importorskip("redis")
    require_service("Redis", "127.0.0.1", 6379)
    name = f"bl-cli-{uuid.uuid4().hex[:10]}"
    yield name
    with redis.Redis.from_url(REDIS_URL) as client:
        keys = list(client.scan_iter(match=f"beatless:{name}:*", count=1_000))
        if keys:
            client.delete(*keys)


def test_every_command_by_store_and_namespace_reads_and_steers_a_node_keyed_by_its_namespace(
    keyed_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node whose store is keyed by its namespace (as every integration opens it): the
    commands given the URL and that namespace see it, pause it, and find what it sent."""
    from beatless.core.triggers import Every
    from beatless.node.scheduler import Scheduler
    from beatless.schedule.entry import Entry, Schedule

    ns = keyed_namespace
    plan = Schedule([Entry(name="tick", task="t.tick", trigger=Every(1))], namespace=ns)
    sent: list[int] = []
    node = Scheduler(
        plan,
        store=stores.open_store(REDIS_URL, namespace=ns),
        node="keyed-node",
        enqueue=lambda firing: sent.append(firing.occurrence_ms),
    )
    fleet = ["--store", REDIS_URL, "--namespace", ns]
    try:
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            node.tick()
            time.sleep(0.1)
        node.board.sync()
        assert sent, "the node sent nothing"
        capsys.readouterr()

        assert main(["status", *fleet, "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert [n["node"] for n in status["nodes"]] == ["keyed-node"]

        at = datetime.fromtimestamp(sent[0] / 1000, UTC).isoformat()
        assert main(["explain", "tick", "--at", at, *fleet]) == 0
        assert "fired: sent by node keyed-node" in capsys.readouterr().out

        assert main(["next", *fleet, "--json", "--count", "2"]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [f["address"] for f in listed] == [f"{ns}/tick"] * 2

        assert main(["pause", "tick", *fleet]) == 0
        node.board.sync()
        assert node.board.paused("tick", node.now_ms()) is not None
        assert main(["resume", "tick", *fleet]) == 0
        node.board.sync()
        assert node.board.paused("tick", node.now_ms()) is None
    finally:
        node.stop(timeout=5)
        node.store.close()


def test_a_namespace_other_than_the_schedules_is_refused(
    schedule_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["status"], ["pause", "heartbeat"], ["next"]):
        given = [*command, "--schedule", schedule_file, "--store", "memory://", "--namespace", "x"]
        assert main(given) == 2
        assert "--namespace 'x' is not the fleet's namespace 'shop'" in capsys.readouterr().err


def test_next_and_explain_read_a_celery_apps_and_a_dramatiq_brokers_schedule(
    tmp_path: Path,
) -> None:
    celery_project(tmp_path, SOUND_CELERY)
    dramatiq_project(tmp_path, 'namespace="shop"', 'bd.every("30s")')
    fleets = {  # nightly: 02:00 in the app's timezone, Europe/Berlin; the broker's, UTC
        "2026-01-01T02:00:00+01:00": ["--celery", "shop_celery"],
        "2026-01-01T02:00:00+00:00": ["--dramatiq", "shop_broker", "shop_actors"],
    }
    for at, fleet in fleets.items():
        listed = run_cli(
            "next", *fleet, "--json", "--entry", "nightly", "--count", "1", cwd=tmp_path
        )
        assert listed.returncode == 0, listed.stderr
        (firing,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert firing["address"] == "shop/nightly"

        told = run_cli("explain", "nightly", *fleet, "--at", at, cwd=tmp_path)
        assert told.returncode == 0, told.stderr
        assert "shop/nightly" in told.stdout
        assert "  happened" in told.stdout  # read from the app's own store


@pytest.mark.slow
def test_a_run_node_is_seen_and_paused_by_store_and_namespace_as_an_integrations_node_is(
    tmp_path: Path, keyed_namespace: str
) -> None:
    """``beatless run`` keys its store by the schedule's namespace, as the integrations
    do: ``--store URL --namespace NS`` reads and steers it, whoever runs the fleet."""
    ns = keyed_namespace
    plan = tmp_path / "s.toml"
    plan.write_text(f'namespace = "{ns}"\n[[entry]]\nname = "tick"\ntask = "t.tick"\nevery = 1\n')
    fleet = ["--store", REDIS_URL, "--namespace", ns]
    process = subprocess.Popen(
        [sys.executable, "-m", "beatless", "run", str(plan), "--store", REDIS_URL, "--node", "r1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, status = time.monotonic() + 20, {}
        while time.monotonic() < deadline:
            shown = run_cli("status", *fleet, "--json")
            status = json.loads(shown.stdout or "{}")
            if shown.returncode == 0 and status["entries"][0].get("last"):
                break
            time.sleep(0.5)
        assert [n["node"] for n in status.get("nodes", [])] == ["r1"], status
        paused = run_cli("pause", "tick", *fleet)
        assert paused.returncode == 0, paused.stderr
        time.sleep(2.5)
        assert run_cli("resume", "tick", *fleet).returncode == 0
        time.sleep(1.5)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=15)
    assert "outcome=paused" in err, err[-2_000:]
