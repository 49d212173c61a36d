"""The differential target: two allocators under identical operations must agree after every step."""

from __future__ import annotations

from kvcheck.faults import get_fault
from kvcheck.lockstep import Lockstep
from kvcheck.swarm import swarm
from kvcheck.targets import load_target
from kvcheck.targets.differential import DifferentialTarget
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.invariants import InvariantViolation
from kvmodel.ops import AddRequest, Finish, Schedule


def test_kvcore_agrees_with_itself_over_a_swarm_run() -> None:
    """Two kvcore instances driven together never disagree."""
    report = swarm(load_target("kvcore+kvcore"), seed=3, max_runs=100)
    assert report.failure is None, str(report.failure and report.failure.violation)


def test_a_planted_fault_makes_the_targets_disagree_by_name() -> None:
    """kvcore against kvcore with the FIFO flip fails targets_agree on the free order, naming both sides."""
    config = TargetConfig(num_blocks=4, block_size=1, groups=(GroupSpec(kind="full"),), enable_caching=False)
    fifo = get_fault("fifo-reuse-when-caching-off").kvcore_target
    lockstep = Lockstep(lambda c: DifferentialTarget(c, [("kvcore", load_target("kvcore")), ("fifo", fifo)]), config)
    lockstep.step(AddRequest("r0", (0, 1)))
    lockstep.step(Schedule("r0", 2, 0, 0))
    try:
        lockstep.step(Finish("r0"))
    except InvariantViolation as violation:
        assert violation.invariant == "targets_agree"
        assert violation.step == 3
        assert "free_order differs between kvcore (expected) and fifo (actual)" in str(violation)
    else:
        raise AssertionError("the FIFO flip went unnoticed by the differential target")
