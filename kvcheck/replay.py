"""Replaying a trace through a target, every invariant checked after every step."""

from __future__ import annotations

import attrs

from kvcheck.lockstep import Lockstep
from kvcheck.targets import TargetFactory, load_target
from kvcheck.trace import Trace
from kvmodel.invariants import InvariantViolation, StepCheck


def resolve_target(target: str = "kvcore", fault: str | None = None) -> TargetFactory:
    """The target factory for ``target``, with ``fault`` planted (into kvcore, or into vllm for the
    faults expressed against it)."""
    if fault is None:
        return load_target(target)
    if target == "vllm":
        from kvcheck.faults import vllm_target_with

        load_target("vllm")  # says clearly when vLLM is missing or another release
        return vllm_target_with(fault)  # type: ignore[no-any-return]
    if target != "kvcore":
        raise ValueError(f"--fault applies to the kvcore and vllm targets only, not {target!r}")
    from kvcheck.faults import get_fault

    return get_fault(fault).kvcore_target


@attrs.define
class Replay:
    """The outcome of a replay: the checked steps, and the violation that stopped it, if any."""

    checks: list[StepCheck] = attrs.Factory(list)
    violation: InvariantViolation | None = None

    @property
    def steps_run(self) -> int:
        return len(self.checks)


def replay(trace: Trace, make_target: TargetFactory) -> Replay:
    """Drive a fresh target through the trace; stops at the first violated invariant."""
    lockstep = Lockstep(make_target, trace.config)
    outcome = Replay()
    for op in trace.ops:
        try:
            lockstep.step(op)
        except InvariantViolation as violation:
            outcome.violation = violation
            if lockstep.last is not None and lockstep.last.step == violation.step:
                outcome.checks.append(lockstep.last)
            return outcome
        assert lockstep.last is not None
        outcome.checks.append(lockstep.last)
    return outcome
