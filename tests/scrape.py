"""What a beatless node serves on its metrics port, read as Prometheus would scrape it."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def won_samples(port: int) -> list[Sample] | None:
    """The ``beatless_firings_total`` samples of outcome ``won`` served on ``port``;
    ``None`` while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    return [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "beatless_firings_total" and sample.labels.get("outcome") == "won"
    ]
