"""The poll duty: each half second polled by one node, chosen by the claim and the
preference."""

from __future__ import annotations

from typing import Any

from beatless.django import PollDuty
from beatless.django._duty import POLL_MS
from beatless.node._prefer import View
from beatless.stores.memory import MemoryStore


class Counting:
    """A bridge that counts its polls, and which were full passes."""

    def __init__(self) -> None:
        self.polls: list[bool] = []

    def poll(self, *, full: bool = False) -> Any:
        self.polls.append(full)


def duties(store: MemoryStore, count: int) -> list[tuple[PollDuty, Counting]]:
    view = View.of({f"n{i}" for i in range(count)}, 0)
    made = []
    for i in range(count):
        bridge = Counting()
        duty = PollDuty(
            bridge,  # type: ignore[arg-type]
            store,
            node=f"n{i}",
            namespace="proj",
            view=lambda: view,
            clock=lambda: store.time_ms() / 1_000,
            hash_every_s=5,
        )
        made.append((duty, bridge))
    return made


def test_each_second_is_polled_by_exactly_one_node() -> None:
    now = [1_800_000_000.0]
    store = MemoryStore(clock=lambda: now[0])
    fleet = duties(store, 3)
    start = 1_800_000_000_000
    for second in range(start, start + 20_000, 1_000):
        now[0] = second / 1_000 + 0.01
        polled = [duty.turn(second) for duty, _ in fleet]  # every node tries: the claim decides
        assert polled.count(True) == 1
    assert sum(len(bridge.polls) for _, bridge in fleet) == 20
    fulls = sum(sum(bridge.polls) for _, bridge in fleet)
    assert fulls == 4  # one second in five is a full pass


def test_each_half_second_is_polled_once_and_full_passes_fall_on_whole_seconds() -> None:
    now = [1_800_000_000.0]
    store = MemoryStore(clock=lambda: now[0])
    fleet = duties(store, 3)
    start = 1_800_000_000_000
    for instant in range(start, start + 20_000, POLL_MS):
        now[0] = instant / 1_000 + 0.01
        polled = [duty.turn(instant) for duty, _ in fleet]
        assert polled.count(True) == 1
    assert POLL_MS == 500
    assert sum(len(bridge.polls) for _, bridge in fleet) == 40
    assert sum(sum(bridge.polls) for _, bridge in fleet) == 4  # whole seconds 0, 5, 10, 15


def test_the_preference_puts_one_node_first_and_one_second_for_each_second() -> None:
    store = MemoryStore()
    fleet = duties(store, 4)
    start = (store.time_ms() // 1_000) * 1_000
    firsts = set()
    for second in range(start, start + 50_000, 1_000):
        ranks = sorted(duty.rank(second) for duty, _ in fleet)
        assert ranks == [0, 1, 2, 3]
        firsts |= {duty.node for duty, _ in fleet if duty.rank(second) == 0}
    assert len(firsts) > 1  # the duty moves between nodes: no leader
