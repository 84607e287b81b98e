"""An entry's JSON codec (``beatless.live.codec``) and the pure fold of revisions
(``beatless.live.revisions``): what every node computes alike."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beatless.core.triggers import Cron, Every
from beatless.errors import ConfigError
from beatless.live import Change, Revision, entry_from_json, entry_to_json, in_force, state
from beatless.live.revisions import content_hash, fold, history
from beatless.schedule.entry import Entry


def fields(entry: Entry) -> dict[str, Any]:
    return {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
names = st.text(
    st.characters(blacklist_characters="\x00/", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
).filter(lambda name: name == name.strip())
crons = st.builds(
    Cron,
    st.sampled_from(["*/5 * * * *", "0 4 * * *", "0 0 1 * MON", "30 2 * * 1-5"]),
    st.sampled_from([None, "UTC", "Europe/Paris", "America/New_York"]),
    day_and=st.sampled_from([None, True, False]),
)
everys = st.builds(
    Every,
    st.integers(1, 10**9).map(lambda us: timedelta(microseconds=us * 1000)),
    st.sampled_from([None, datetime(2026, 3, 1, 4, 30, tzinfo=UTC)]),
)


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    jitter_s = draw(st.integers(0, 30))
    return Entry(
        name=draw(names),
        task=draw(names),
        trigger=draw(crons | everys) if jitter_s == 0 else draw(st.just(Every(timedelta(hours=1)))),
        args=draw(st.lists(json_values, max_size=3)),
        kwargs=draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        options=draw(st.dictionaries(st.text(max_size=5), json_values, max_size=2)),
        jitter=timedelta(seconds=jitter_s, microseconds=draw(st.integers(0, 999_999))),
        max_late=timedelta(seconds=draw(st.integers(31, 3600))),
        catch_up=draw(st.sampled_from(["latest", "all", "none"])),
        overlap=draw(st.sampled_from(["allow", "skip"])),
        once_only=draw(st.booleans()),
        tenants=draw(
            st.none()
            | st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=3, unique=True)
        ),
    )


@settings(max_examples=200, deadline=None)
@given(entries())
def test_an_entry_comes_back_from_its_json_exactly(entry: Entry) -> None:
    text = json.dumps(entry_to_json(entry))
    back = entry_from_json(json.loads(text))

    assert fields(back) == fields(entry)
    assert entry_to_json(back) == entry_to_json(entry)


def test_what_json_cannot_hold_is_refused_naming_the_entry() -> None:
    entry = Entry(name="x", task="t", trigger=Every(60), args=[{1, 2}])
    with pytest.raises(ConfigError, match="entry 'x': args must be JSON"):
        entry_to_json(entry)
    with pytest.raises(ConfigError, match="fixed list of tenants"):
        entry_to_json(Entry(name="y", task="t", trigger=Every(60), tenants=lambda: ["a"]))


def test_a_stored_entry_of_another_format_is_refused() -> None:
    data = entry_to_json(Entry(name="x", task="t", trigger=Every(60))) | {"v": 3}
    with pytest.raises(ConfigError, match="format 3"):
        entry_from_json(data)


def test_the_content_hash_covers_args_kwargs_and_options() -> None:
    base = Entry(name="x", task="t", trigger=Every(60))
    hashes = {
        content_hash([Change("x", entry_to_json(e))])
        for e in (
            base,
            base.replace(args=(1,)),
            base.replace(kwargs={"a": 1}),
            base.replace(options={"queue": "q"}),
        )
    }
    assert len(hashes) == 4


# -- the fold, by property --------------------------------------------------------------

revision_lists = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.sampled_from("abcd"), st.none() | st.integers(0, 3)),
            min_size=1,
            max_size=4,
        ),
        st.integers(0, 5_000),
    ),
    max_size=8,
)


def build(drawn: list[tuple[list[tuple[str, int | None]], int]]) -> list[Revision]:
    revisions, fence = [], 0
    for number, (changes, step) in enumerate(drawn, start=1):
        fence += step
        made = tuple(Change(n, None if v is None else {"value": v}) for n, v in changes)
        revisions.append(Revision(number=number, changes=made, committed_ms=fence, fence_ms=fence))
    return revisions


@given(revision_lists, st.integers(0, 10))
def test_the_state_at_a_revision_is_the_fold_of_the_revisions_up_to_it(drawn: Any, at: int) -> None:
    revisions = build(drawn)
    expected: dict[str, Any] = {}
    for revision in revisions[:at]:
        expected = fold(expected, revision.changes)

    assert state(revisions, at) == expected
    assert state(list(reversed(revisions)), at) == expected  # order of reading does not matter
    assert state(revisions) == state(revisions, len(revisions))


@given(revision_lists, st.integers(-1, 50_000))
def test_an_occurrence_runs_under_the_latest_revision_whose_fence_is_at_or_before_it(
    drawn: Any, occurrence_ms: int
) -> None:
    revisions = build(drawn)
    chosen = in_force(revisions, occurrence_ms)
    eligible = [r for r in revisions if r.fence_ms <= occurrence_ms]

    if not eligible:
        assert chosen is None  # rule 2: before every fence, no live entry
    else:
        assert chosen is not None
        assert chosen.fence_ms <= occurrence_ms
        assert chosen.number == max(r.number for r in eligible)
        assert all(r.fence_ms > occurrence_ms for r in revisions if r.number > chosen.number)


def test_history_lists_the_revisions_that_change_a_name_oldest_first() -> None:
    revisions = build([([("a", 1)], 0), ([("b", 1)], 1), ([("a", None)], 1)])
    assert [r.number for r in history(revisions, "a")] == [1, 3]
    assert [r.number for r in history(revisions)] == [1, 2, 3]


def test_a_revision_reads_back_from_its_json_and_an_altered_one_is_refused() -> None:
    revision = build([([("a", 1), ("b", None)], 5)])[0]
    assert Revision.from_json(revision.to_json()) == revision
    altered = revision.to_json()
    altered["changes"][0]["entry"] = {"value": 2}
    with pytest.raises(ConfigError, match="altered"):
        Revision.from_json(altered)
