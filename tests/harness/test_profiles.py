"""Which profiles must reach every coverage label: the derandomized ones with the ci budget."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvcheck.profiles import PROFILES, has_ci_budget, labels_must_be_reached


@pytest.mark.parametrize(("name", "required"), [("ci", True), ("dev", False), ("thorough", False), ("smoke", False)])
def test_only_a_derandomized_run_with_the_ci_budget_must_reach_every_label(name: str, required: bool) -> None:
    assert labels_must_be_reached(PROFILES[name]) is required


def test_a_derandomized_run_above_the_ci_budget_must_reach_them_too() -> None:
    assert labels_must_be_reached(settings(PROFILES["ci"], max_examples=PROFILES["ci"].max_examples + 1))
    assert not labels_must_be_reached(settings(PROFILES["ci"], max_examples=PROFILES["ci"].max_examples - 1))


@pytest.mark.parametrize(("name", "full"), [("dev", True), ("ci", True), ("thorough", True), ("smoke", False)])
def test_only_smoke_has_less_than_the_ci_budget(name: str, full: bool) -> None:
    """``smoke`` shows that an installation runs the suite: the seed-bug tests search from their first
    seed alone there (``stateful_tests/test_manager_machine_catches_seed_bugs.py``)."""
    assert has_ci_budget(PROFILES[name]) is full
