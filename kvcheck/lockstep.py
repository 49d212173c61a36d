"""Drive a target and the reference model through the same operations, checking every step.

This is the one place where a target, the model and the invariants meet.
State machines, trace replay and plain random drivers all step through a
:class:`Lockstep`; nothing here depends on Hypothesis.
"""

from __future__ import annotations

from kvcheck.config import TargetConfig
from kvcheck.models.invariants import InvariantViolation, StepCheck, check_all
from kvcheck.models.manager_model import ManagerModel
from kvcheck.ops import Operation, StepResult, describe_op
from kvcheck.targets import Target, TargetFactory


class Lockstep:
    """A target and a model stepped together; the operations so far are kept as the trace."""

    total_steps = 0
    """Steps taken by every Lockstep in this process (for summaries and benchmarks)."""
    latest: Lockstep | None = None
    """The most recently created Lockstep: after a failing test, the one that failed."""

    def __init__(self, make_target: TargetFactory, config: TargetConfig, check: bool = True) -> None:
        self.config = config.validate()
        self.target: Target = make_target(config)
        self.model = ManagerModel(config)
        self.check = check
        self.trace: list[Operation] = []
        self.last: StepCheck | None = None
        Lockstep.latest = self

    def step(self, op: Operation) -> tuple[StepResult, StepResult]:
        """Apply ``op`` to both; with checking on, raise the first invariant violation."""
        self.trace.append(op)
        Lockstep.total_steps += 1
        step = len(self.trace)
        try:
            sut_result = self.target.apply(op)
            sut = self.target.observe() if self.check else None
        except InvariantViolation:
            raise
        except Exception as exc:
            raise InvariantViolation(
                "target_raised", step, describe_op(op), f"the target raised {type(exc).__name__}: {exc}"
            ) from exc
        model_result = self.model.apply(op)
        if self.check:
            assert sut is not None
            self.last = StepCheck(
                step=step,
                op=op,
                config=self.config,
                sut_result=sut_result,
                model_result=model_result,
                sut=sut,
                model=self.model.observe(),
            )
            check_all(self.last)
            try:
                self.target.check_internal()
            except AssertionError as exc:
                raise InvariantViolation(
                    "target_self_check", self.last.step, describe_op(op), f"the target's own check failed: {exc}"
                ) from exc
        return sut_result, model_result
