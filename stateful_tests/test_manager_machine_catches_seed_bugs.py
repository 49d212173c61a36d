"""The Hypothesis manager machine itself reaches the two seed bugs and shrinks them to short repros.

Each seed fault is planted into kvcore and the machine runs with fixed,
derandomized settings (the ci budget, whatever profile is loaded), so a
change to the rules or strategies that stops the generator from visiting
these states fails here.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.faults import get_fault
from kvcheck.lockstep import Lockstep
from models.invariants import InvariantViolation
from stateful_tests.manager_machine import manager_machine

SEARCH = settings(
    derandomize=True,
    database=None,
    max_examples=400,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    phases=[Phase.generate, Phase.target, Phase.shrink],
)


@pytest.mark.parametrize(
    ("fault", "invariants", "max_steps"),
    [
        ("fifo-reuse-when-caching-off", ("lifo_head_reuse_when_caching_off",), 4),
        ("interleaved-external-alloc", ("no_duplicate_block_ids", "ref_cnt_matches_holders"), 6),
    ],
)
def test_manager_machine_catches_seed_bug(fault: str, invariants: tuple[str, ...], max_steps: int) -> None:
    """With the seed bug planted, the two-group manager machine fails by the named invariant,
    and the shrunk failing run is at most ``max_steps`` operations long."""
    machine = manager_machine(get_fault(fault).kvcore_target, num_groups=2)
    with pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(machine, settings=SEARCH)
    violation = caught.value
    assert violation.invariant in invariants, violation
    shrunk = Lockstep.latest
    assert shrunk is not None and len(shrunk.trace) == violation.step
    assert violation.step <= max_steps, f"shrunk to {violation.step} steps: {shrunk.trace}"
