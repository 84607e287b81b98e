"""Names ``beatless.celery`` had before: still importable, with a DeprecationWarning."""

from __future__ import annotations

import importlib

import pytest
from celery.utils.imports import symbol_by_name

from beatless.celery import BeatlessStep


def test_the_bootsteps_first_name_still_loads_it_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"beatless.celery.Beatless is renamed .*Step"):
        from beatless.celery import Beatless  # type: ignore[attr-defined]
    assert Beatless is BeatlessStep


def test_the_old_name_given_as_a_string_loads_the_bootstep() -> None:
    """As Celery loads a class named in configuration (``"module:Name"``)."""
    with pytest.warns(DeprecationWarning, match="renamed beatless.celery.BeatlessStep"):
        loaded = symbol_by_name("beatless.celery:Beatless")
    assert loaded is BeatlessStep


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    module = importlib.import_module("beatless.celery")
    with pytest.raises(AttributeError, match="has no attribute 'Beatles'"):
        module.Beatles  # noqa: B018 - the lookup is the test
