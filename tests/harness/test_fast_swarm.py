"""The swarm driver's fast mode: the whole state checked every N steps, the step's results (and steps in
flight) in between, and any violation reported as a full check of every step reports it.  That the fast
mode finds every catalogued fault is checked beside its kill, in ``tests/harness/test_kill_matrix.py``."""

from __future__ import annotations

import pytest

from kvcheck.faults import get_fault
from kvcheck.lockstep import Lockstep
from kvcheck.swarm import swarm
from kvcheck.targets import load_target
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.invariants import InvariantViolation
from kvmodel.ops import AddRequest, Finish, Schedule

FAST = 8


def test_the_fast_mode_drives_the_same_steps_and_keeps_every_invariant_on_kvcore() -> None:
    full = swarm(load_target("kvcore"), seed=3, max_runs=300)
    fast = swarm(load_target("kvcore"), seed=3, max_runs=300, full_check_every=FAST)
    assert full.failure is None and fast.failure is None
    assert (fast.runs, fast.steps) == (full.runs, full.steps)


CACHING_OFF = TargetConfig(num_blocks=6, block_size=1, groups=(GroupSpec(kind="full"),), enable_caching=False)


def test_a_violation_between_full_checks_is_reported_at_its_own_step() -> None:
    """Seed 000's FIFO flip shows in the free order at the finish (step 3); with full checks every 8
    steps the run's end finds it, and the report still names step 3."""
    ops = [AddRequest("r0", (1, 2)), Schedule("r0", 2, 0, 0), Finish("r0"), AddRequest("r1", (3,))]
    lockstep = Lockstep(get_fault("fifo-reuse-when-caching-off").kvcore_target, CACHING_OFF, full_check_every=FAST)
    for op in ops:
        lockstep.step(op)
    with pytest.raises(InvariantViolation) as caught:
        lockstep.finish()
    assert (caught.value.invariant, caught.value.step) == ("lifo_head_reuse_when_caching_off", 3)


def test_finish_checks_the_state_a_clean_run_ends_in() -> None:
    lockstep = Lockstep(load_target("kvcore"), CACHING_OFF, full_check_every=FAST)
    lockstep.step(AddRequest("r0", (1, 2)))
    lockstep.step(Schedule("r0", 2, 0, 0))
    assert lockstep.checked_in_full == 0
    lockstep.finish()
    assert lockstep.checked_in_full == 2 and lockstep.last is not None


def test_a_full_check_interval_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="full_check_every: 0 is below the minimum of 1"):
        Lockstep(load_target("kvcore"), CACHING_OFF, full_check_every=0)
