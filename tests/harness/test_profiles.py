"""Which profiles must reach every coverage label: the derandomized ones with the ci budget."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvcheck.stateful_tests.profiles import PROFILES, labels_must_be_reached


@pytest.mark.parametrize(("name", "required"), [("ci", True), ("dev", False), ("thorough", False), ("smoke", False)])
def test_only_a_derandomized_run_with_the_ci_budget_must_reach_every_label(name: str, required: bool) -> None:
    assert labels_must_be_reached(PROFILES[name]) is required


def test_a_derandomized_run_above_the_ci_budget_must_reach_them_too() -> None:
    assert labels_must_be_reached(settings(PROFILES["ci"], max_examples=PROFILES["ci"].max_examples + 1))
    assert not labels_must_be_reached(settings(PROFILES["ci"], max_examples=PROFILES["ci"].max_examples - 1))
