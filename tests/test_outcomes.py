"""The decision outcomes, named once (:class:`DecisionOutcome`), keep the strings that the
history notes, the counters, the logs and the metrics carry."""

from __future__ import annotations

import json

from beatless.node.dispatch import RECORDED
from beatless.node.stats import EntryStats
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import Outcome


def test_an_outcome_is_written_as_its_string() -> None:
    assert DecisionOutcome.SKIPPED_OVERLAP == "skipped_overlap"
    assert f"{DecisionOutcome.WON}" == str(DecisionOutcome.WON) == "won"
    assert json.dumps({"outcome": DecisionOutcome.LATE_STORE}) == '{"outcome": "late_store"}'
    assert {"won": 1}[DecisionOutcome.WON] == 1


def test_every_claim_answer_of_a_store_is_a_decision_and_a_store_late_is_late_store() -> None:
    decided = {o: DecisionOutcome.of_claim(o) for o in Outcome}
    assert decided[Outcome.LATE] is DecisionOutcome.LATE_STORE
    assert all(d == o.value for o, d in decided.items() if o is not Outcome.LATE)


def test_the_groups_nest_sent_in_claim_decided_in_history() -> None:
    assert {"won", "takeover"} == DecisionOutcome.SENT
    assert {"won", "takeover", "forgotten", "skipped_overlap"} == DecisionOutcome.CLAIM_DECIDED
    assert DecisionOutcome.CLAIM_DECIDED | {"paused", "missed"} == DecisionOutcome.HISTORY
    assert DecisionOutcome.CLAIM_DECIDED <= DecisionOutcome.SETTLED
    assert DecisionOutcome.HELD not in DecisionOutcome.SETTLED


def test_a_claim_script_records_the_history_of_the_outcomes_a_claim_decides() -> None:
    assert {Outcome.WON, Outcome.TAKEOVER, Outcome.OVERLAP, Outcome.FORGOTTEN} == RECORDED


def test_every_outcome_but_held_adds_to_one_counter() -> None:
    for outcome in DecisionOutcome:
        stats = EntryStats()
        stats.count(outcome)
        counted = {k: v for k, v in stats.as_dict().items() if isinstance(v, int) and v}
        if outcome is DecisionOutcome.HELD:
            assert not counted
        elif outcome is DecisionOutcome.TAKEOVER:
            assert counted == {"won": 1, "takeovers": 1}
        else:
            assert len(counted) == 1, (outcome, counted)
