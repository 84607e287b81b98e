"""A fan-out is never expanded into firings nobody looks at: ``next`` and ``explain``
build only the firings they print, and the loop's cursor holds one integer per pending
firing and hands them out in release order."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
import uuid
from pathlib import Path

import pytest

from beatless import Entry, Every, Firing, Schedule
from beatless.cli._next import upcoming
from beatless.cli.command import main
from beatless.errors import ConfigError
from beatless.schedule._fanout import CHUNK, FanOut, bucket_count, earliest
from beatless.schedule.entry import canonical

WIDE = 50_000
OCCURRENCE_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a multiple of 10 minutes


def fan_entry(tenants: int, *, jitter: str | int = "4m") -> Entry:
    return Entry(
        name="fan",
        task="t.fan",
        trigger=Every("10m"),
        jitter=jitter,
        max_late="5m",
        tenants=[f"tenant-{i}" for i in range(tenants)],
    )


@pytest.fixture
def wide_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``module:attribute`` target: entry ``fan`` of ``WIDE`` tenants, and ``plain``."""
    module = f"wide_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from beatless import Entry, Every, Schedule\n"
        "schedule = Schedule([\n"
        "    Entry(name='fan', task='t.fan', trigger=Every('10m'), jitter='4m', max_late='5m',\n"
        f"          tenants=[f'tenant-{{i}}' for i in range({WIDE})]),\n"
        "    Entry(name='plain', task='t.plain', trigger=Every('1m')),\n"
        "], namespace='wide')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:schedule"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of ``Firing`` objects built and of SHA-256 digests computed."""
    counts = {"firings": 0, "sha256": 0}
    build, sha256 = Firing.of.__func__, hashlib.sha256  # type: ignore[attr-defined]

    def of(cls: type[Firing], *args: object) -> Firing:
        counts["firings"] += 1
        return build(cls, *args)  # type: ignore[no-any-return]

    def counting_sha256(data: bytes = b"", *, usedforsecurity: bool = True) -> object:
        counts["sha256"] += 1
        return sha256(data, usedforsecurity=usedforsecurity)

    monkeypatch.setattr(Firing, "of", classmethod(of))
    monkeypatch.setattr(hashlib, "sha256", counting_sha256)
    return counts


def expected_earliest(
    namespace: str, tenants: int, occurrence_ms: int, window_ms: int
) -> list[tuple[int, str]]:
    """Every tenant's (offset, tenant) by the published formula, in release order."""
    rows = []
    for i in range(tenants):
        text = f"{namespace}/fan/tenant-{i}@{occurrence_ms}".encode()
        lead53 = int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 11
        rows.append(((window_ms * lead53) >> 53, i, f"tenant-{i}"))
    return [(offset, tenant) for offset, _, tenant in sorted(rows)]


# -- next -------------------------------------------------------------------------------


def test_next_count_1_of_a_wide_fan_out_builds_one_firing_and_one_digest_per_tenant(
    wide_target: str, counted: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    after = "2027-01-15T07:59:00Z"
    assert main(["next", wide_target, "--entry", "fan", "--count", "1", "--after", after]) == 0

    rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 1
    assert counted["firings"] == 1
    # the earliest release needs every tenant's offset, once each, and nothing more
    assert WIDE <= counted["sha256"] <= WIDE + 10
    offset, tenant = expected_earliest("wide", WIDE, OCCURRENCE_MS, 240_000)[0]
    assert f"wide/fan/{tenant} " in rows[0]
    assert f" {offset} ms " in rows[0]


def test_next_holds_memory_for_what_it_prints_not_for_the_tenants() -> None:
    entry = fan_entry(WIDE)
    schedule = Schedule([entry], namespace="wide")
    tracemalloc.start()
    try:
        firings = list(upcoming(schedule, [entry], OCCURRENCE_MS - 1, 3))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert len(firings) == 3
    # a list of WIDE firings would be over 15 MB; a heap of three keys is a few KB
    assert peak < 512 * 1024


def test_next_lists_a_fan_outs_earliest_releases_as_the_formula_orders_them(
    wide_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    after = "2027-01-15T07:59:00Z"
    main(["next", wide_target, "--entry", "fan", "--count", "7", "--after", after, "--json"])

    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = [(r["offset_ms"], r["tenant"]) for r in rows]
    assert got == expected_earliest("wide", WIDE, OCCURRENCE_MS, 240_000)[:7]
    assert {r["occurrence"] for r in rows} == {"2027-01-15T08:00:00.000Z"}


def test_next_continues_into_the_next_occurrence_when_count_exceeds_the_tenants() -> None:
    entry = fan_entry(5)
    schedule = Schedule([entry], namespace="small")

    firings = sorted(upcoming(schedule, [entry], OCCURRENCE_MS - 1, 8), key=lambda f: f.release_ms)

    assert [f.occurrence_ms for f in firings] == [OCCURRENCE_MS] * 5 + [OCCURRENCE_MS + 600_000] * 3
    second = expected_earliest("small", 5, OCCURRENCE_MS + 600_000, 240_000)[:3]
    assert [(f.offset_ms, f.tenant) for f in firings[5:]] == second
    assert [f.release_ms for f in firings] == sorted(f.release_ms for f in firings)


def test_next_of_one_tenant_lists_its_address_only_and_digests_only_it(
    wide_target: str, counted: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["next", wide_target, "--entry", "fan", "--tenant", "tenant-4242", "--count", "3"]
    assert main([*args, "--after", "2027-01-15T07:59:00Z", "--json"]) == 0

    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["address"] for r in rows] == ["wide/fan/tenant-4242"] * 3
    assert [r["occurrence"][11:16] for r in rows] == ["08:00", "08:10", "08:20"]
    assert counted["firings"] == 3
    assert counted["sha256"] <= 3 + 2


def test_next_of_a_tenant_needs_its_entry_and_one_of_its_tenants(
    wide_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["next", wide_target, "--tenant", "tenant-1"]) == 2
    assert "--tenant needs --entry" in capsys.readouterr().err
    assert main(["next", wide_target, "--entry", "fan", "--tenant", "nobody"]) == 2
    assert f"fans out to {WIDE} tenants" in capsys.readouterr().err
    assert main(["next", wide_target, "--entry", "plain", "--tenant", "tenant-1"]) == 2
    assert "has no tenants" in capsys.readouterr().err


def test_next_gives_each_entry_its_count_whatever_its_tenants(
    wide_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["next", wide_target, "--count", "2", "--after", "2027-01-15T07:59:30Z", "--json"])

    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["entry"] for r in rows].count("plain") == 2
    assert [r["entry"] for r in rows].count("fan") == 2


# -- explain ----------------------------------------------------------------------------


def test_explain_of_one_tenant_of_a_wide_fan_out_digests_that_tenant_only(
    wide_target: str, counted: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["explain", wide_target, "fan", "--at", "2027-01-15T08:00:00Z"]
    assert main([*args, "--tenant", f"tenant-{WIDE - 1}"]) == 0

    out = capsys.readouterr().out
    assert f"wide/fan/tenant-{WIDE - 1}@{OCCURRENCE_MS}" in out
    assert counted["firings"] <= 1
    assert counted["sha256"] <= 3


# -- the loop's cursor ------------------------------------------------------------------


def test_fan_out_hands_out_every_tenant_once_in_release_order_as_firing_of_derives_it() -> None:
    tenants = 3 * CHUNK + 123
    entry = fan_entry(tenants)
    names = entry.tenant_list()
    assert names is not None
    fan = FanOut(entry, "ns/fan", OCCURRENCE_MS, names)
    assert len(fan.lanes[0].buckets) == bucket_count(tenants, entry.jitter_ms) > 1
    prepares = 0
    while not fan.is_prepared:
        fan.prepare()
        prepares += 1
    assert prepares == 4  # one chunk per wake

    taken: list[Firing] = []
    now = OCCURRENCE_MS
    while fan.remaining:
        release = fan.next_release_ms()
        assert release >= now
        now = release + 997  # wakes that fall between releases
        batch = fan.take(now, 5_000)
        assert batch
        assert all(f.release_ms <= now for f in batch)
        taken.extend(batch)

    assert len(taken) == tenants
    assert len({f.tenant for f in taken}) == tenants
    assert [f.release_ms for f in taken] == sorted(f.release_ms for f in taken)
    for firing in taken[:: tenants // 50]:
        assert firing == Firing.of(entry, firing.tenant, firing.address, OCCURRENCE_MS)


def test_fan_out_take_stops_at_its_limit_and_at_the_instant_across_buckets() -> None:
    entry = fan_entry(20_000)
    names = entry.tenant_list()
    assert names is not None
    fan = FanOut(entry, "ns/fan", OCCURRENCE_MS, names)
    fan.prepare()
    everything = [
        firing
        for _, firing in sorted(
            ((f.release_ms, i), f)
            for i, f in enumerate(Firing.of(entry, t, f"ns/fan/{t}", OCCURRENCE_MS) for t in names)
        )
    ]
    middle = everything[12_345].release_ms
    later = sum(1 for f in everything if f.release_ms > middle)

    first = fan.take(middle, 9_000)
    rest = fan.take(middle, 100_000)

    assert len(first) == 9_000
    assert [f.id for f in first + rest] == [f.id for f in everything if f.release_ms <= middle]
    assert fan.remaining == later > 0
    assert fan.take(OCCURRENCE_MS - 1, 10) == []
    assert fan.drop() == later
    assert fan.remaining == 0
    assert fan.take(OCCURRENCE_MS + 10**9, 10) == []


def test_fan_out_without_jitter_releases_every_tenant_at_the_occurrence_in_list_order() -> None:
    entry = fan_entry(10_000, jitter=0)
    names = entry.tenant_list()
    assert names is not None
    fan = FanOut(entry, "ns/fan", OCCURRENCE_MS, names)
    fan.prepare()

    assert fan.next_release_ms() == OCCURRENCE_MS
    firings = fan.take(OCCURRENCE_MS, 100_000)

    assert [f.tenant for f in firings] == list(names)


def test_fan_out_holds_about_8_bytes_per_pending_firing() -> None:
    tenants = 3 * CHUNK
    entry = fan_entry(tenants)
    names = entry.tenant_list()
    assert names is not None
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        fan = FanOut(entry, "ns/fan", OCCURRENCE_MS, names)
        while not fan.is_prepared:
            fan.prepare()
        fan.next_release_ms()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (held - start) / tenants < 9
    assert (peak - start) / tenants < 12  # no sort of all the keys at once
    assert fan.remaining == tenants


def test_earliest_returns_the_first_releases_and_builds_only_those(
    counted: dict[str, int],
) -> None:
    entry = fan_entry(2_000)
    names = entry.tenant_list()
    assert names is not None

    firings = earliest(entry, "n/fan", OCCURRENCE_MS, names, 4)

    assert counted["firings"] == 4
    assert [(f.offset_ms, f.tenant) for f in firings] == expected_earliest(
        "n", 2_000, OCCURRENCE_MS, 240_000
    )[:4]
    assert earliest(entry, "n/fan", OCCURRENCE_MS, names, 0) == []


# -- the entry's list -------------------------------------------------------------------


def test_a_tenant_listed_twice_is_named_in_the_error() -> None:
    tenants = [f"t{i}" for i in range(1_000)] + ["t500"]
    with pytest.raises(ConfigError, match=r"tenants must not repeat \('t500' does\)"):
        Entry(name="fan", task="t", trigger=Every("1m"), tenants=tenants)


def reference_fingerprint(schedule: Schedule) -> str:
    """The fingerprint as its docstring defines it, written the plain way."""
    lines = sorted(
        "|".join(
            (
                schedule.address(e),
                repr(e.trigger),
                str(e.jitter_ms),
                str(e.max_late_ms),
                e.task,
                "callable" if callable(e.tenants) else ",".join(e.tenants or ()),
                e.catch_up,
                e.overlap,
                str(int(e.run_lease.total_seconds() * 1_000)),
                str(int(e.heartbeat.total_seconds() * 1_000)),
                str(e.once_only),
                canonical(e.args),
                canonical(e.kwargs),
                canonical(e.options),
            )
        )
        for e in schedule.entries
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    "names",
    [
        ["fan", "plain", "calls", "none"],
        ["a", "a|1", "ab", "a|"],  # one line's start is another's: whole lines decide
        ["é", "e", "z|every", "z"],
    ],
)
def test_the_fingerprint_of_a_wide_fan_out_is_the_hash_of_its_documented_text(
    names: list[str],
) -> None:
    def make(name: str, tenants: object) -> Entry:
        return Entry(name=name, task=f"t.{name}", trigger=Every("1m"), tenants=tenants)  # type: ignore[arg-type]

    wide = [f"tenant-{i}" for i in range(25_000)]
    schedule = Schedule(
        [
            make(names[0], wide),
            make(names[1], None),
            make(names[2], lambda: ["x"]),
            make(names[3], ["ü", "b,c", ""]),
        ]
    )

    assert schedule.fingerprint == reference_fingerprint(schedule)
    assert (
        Schedule([make(names[0], wide[:-1])]).fingerprint
        != Schedule([make(names[0], wide)]).fingerprint
    )


def test_the_fingerprint_orders_whole_lines_when_one_entry_line_starts_another() -> None:
    trigger = Every("1m")
    first = Entry(name="a", task="t", trigger=trigger, tenants=["zzz"])
    # its line starts with the whole of the first entry's line up to the tenants
    second = Entry(name=f"a|{trigger!r}|0|60000|t|x", task="t", trigger=trigger)
    schedule = Schedule([first, second])
    heads = sorted(schedule._fingerprint_parts(e)[0] for e in schedule.entries)

    assert heads[1].startswith(heads[0])
    assert schedule.fingerprint == reference_fingerprint(schedule)
