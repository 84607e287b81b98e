"""The table ``bench/core.py`` prints: one aligned line per figure of its JSON result."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def rows(result: dict[str, Any]) -> Iterator[tuple[str, str]]:
    p, load, first, mem = (
        result["parameters"],
        result["load"],
        result["first_releases"],
        result["memory"],
    )
    yield "addresses", f"{p['addresses']:,} ({len(p['triggers'])} crons × {p['tenants']:,} tenants)"
    yield "crons", ", ".join(p["triggers"])
    yield "jitter / max_late", f"{p['jitter_s']} s / {p['max_late_s']} s"
    yield "load schedule", f"{load['wall_s']:.3f} s wall, {load['cpu_s']:.3f} s CPU"
    parts = (
        f"Scheduler {first['scheduler_cpu_s']:.3f} s + first wake "
        f"{first['first_wake_cpu_s']:.3f} s, {first['firings_planned']:,} firings"
    )
    yield (
        "first releases",
        f"{first['wall_s']:.3f} s wall, {first['cpu_s']:.3f} s CPU ({parts})",
    )
    base = mem["rss_before_mb"]
    yield (
        "RSS",
        f"{base:.1f} MB before, +{mem['rss_after_load_mb'] - base:.1f} MB after load, "
        f"+{mem['rss_after_first_releases_mb'] - base:.1f} MB after first releases",
    )
    yield (
        "peak RSS",
        f"{mem['peak_after_first_releases_mb']:.1f} MB after first releases, "
        f"{mem['peak_after_one_node_mb']:.1f} MB after the 1-node run",
    )
    yield from node_rows("1 node", result["one_node"], p)
    yield from three_node_rows(result["three_nodes"], p)
    yield from celery_rows(result["celery_beat"], result["one_node"])


def node_rows(label: str, sim: dict[str, Any], p: dict[str, Any]) -> Iterator[tuple[str, str]]:
    per_wake = sim["claim_calls"] / sim["wakes_with_due"] if sim["wakes_with_due"] else 0
    yield (
        f"{label}: CPU per sim. hour",
        f"{sim['cpu_per_hour_s']:.3f} s ({sim['cpu_s']:.3f} s over {p['simulated_hours']:g} h)",
    )
    yield f"{label}: firings per hour", f"{sim['firings_per_hour']:,.0f}"
    yield (
        f"{label}: CPU per firing",
        f"{sim['us_per_firing']:.1f} µs" if sim["us_per_firing"] else "-",
    )
    yield (
        f"{label}: wakes",
        (f"{sim['wakes']:,} ({sim['wakes_with_due']:,} with due firings, step {p['step_ms']} ms)"),
    )
    yield (
        f"{label}: round trips",
        (
            f"{per_wake:.2f} claim call(s) per wake with due firings "
            f"({sim['claim_calls']:,} claims, {sim['commit_calls']:,} commits)"
        ),
    )
    yield f"{label}: exactly once", check_text(sim["check"])


def three_node_rows(sim: dict[str, Any], p: dict[str, Any]) -> Iterator[tuple[str, str]]:
    label = f"{len(sim['nodes'])} nodes"
    for node in sim["nodes"]:
        yield (
            f"{label}: {node['node']}",
            (
                f"{node['cpu_per_hour_s']:.3f} s CPU per hour, won {node['won']:,} of "
                f"{node['decided']:,} claimed, {node['us_per_firing']:.1f} µs per claimed firing"
            ),
        )
    per_wake = sim["claim_calls"] / sim["wakes_with_due"] if sim["wakes_with_due"] else 0
    yield (
        f"{label}: all nodes",
        (
            f"{sim['cpu_per_hour_s']:.3f} s CPU per hour, {sim['us_per_firing_all_nodes']:.1f} µs "
            f"per firing, {per_wake:.2f} claim call(s) per wake with due firings"
        ),
    )
    yield f"{label}: exactly once", check_text(sim["check"])


def check_text(check: dict[str, Any]) -> str:
    verdict = "PASS" if check["ok"] else "FAIL"
    return (
        f"{verdict}: {check['won']:,} won of {check['expected']:,} expected, "
        f"{check['missed']} missed, {check['duplicates']} duplicated, "
        f"{check['unexpected']} unexpected"
    )


def celery_rows(beat: dict[str, Any], sim: dict[str, Any]) -> Iterator[tuple[str, str]]:
    if not beat["measured"]:
        yield "celery beat", f"not measured: {beat['reason']}"
        return
    load = beat["load"]
    yield (
        "celery beat: load",
        (
            f"{load['wall_s']:.3f} s wall, {load['cpu_s']:.3f} s CPU "
            f"({beat['entries']:,} entries: crontabs {load['beat_schedule_cpu_s']:.3f} s "
            f"+ Scheduler {load['scheduler_cpu_s']:.3f} s)"
        ),
    )
    yield (
        "celery beat: RSS",
        (
            f"+{beat['rss_after_load_mb'] - beat['rss_before_mb']:.1f} MB after load, "
            f"+{beat['rss_after_first_wake_mb'] - beat['rss_before_mb']:.1f} MB after first wake, "
            f"peak {beat['peak_mb']:.1f} MB"
        ),
    )
    yield "celery beat: first wake", f"{beat['first_wake_cpu_s']:.3f} s CPU (is_due of every entry)"
    yield "celery beat: idle wake", f"{beat['idle_wake_cpu_s'] * 1e3:.1f} ms CPU (nothing due)"
    yield (
        "celery beat: due wake",
        (
            f"{beat['due_wake_cpu_s'] * 1e3:.1f} ms CPU per task sent "
            f"({beat['due_wakes_sent']} sent in {beat['due_wakes']} wakes; beat sends one per wake)"
        ),
    )
    projected = beat["due_wake_cpu_s"] * sim["firings_per_hour"]
    yield (
        "celery beat: projection",
        (
            f"{projected:,.0f} s CPU per hour for {sim['firings_per_hour']:,.0f} firings "
            "(due-wake cost × firings; not simulated)"
        ),
    )
