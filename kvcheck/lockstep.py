"""Drive a target and the reference model through the same operations, checking every step.

This is the one place where a target, the model and the invariants meet.
State machines, trace replay and plain random drivers all step through a
:class:`Lockstep`; nothing here depends on Hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kvcheck.targets import Target, TargetFactory
from kvcheck.vllm_releases import semantics_in_force
from kvmodel.config import TargetConfig
from kvmodel.invariants import (
    NOT_OBSERVED,
    EventReplay,
    InvariantViolation,
    StepCheck,
    check_all,
    check_results,
    in_flight_blocks_held,
)
from kvmodel.manager_model import ManagerModel
from kvmodel.ops import Operation, StepResult, describe_op

T = TypeVar("T")


class Lockstep:
    """A target and a model stepped together; the operations so far are kept as the trace."""

    total_steps = 0
    """Steps taken by every Lockstep in this process (for summaries and benchmarks)."""
    latest: Lockstep | None = None
    """The most recently created Lockstep: after a failing test, the one that failed."""

    def __init__(
        self, make_target: TargetFactory, config: TargetConfig, check: bool = True, full_check_every: int = 1
    ) -> None:
        if full_check_every < 1:
            raise ValueError(f"full_check_every: {full_check_every} is below the minimum of 1")
        self.config = config.validate()
        self.make_target = make_target
        self.target: Target = make_target(config)
        self.model = ManagerModel(config, semantics_in_force())
        self.check = check
        self.full_check_every = full_check_every
        self.trace: list[Operation] = []
        self.last: StepCheck | None = None
        self.checked_in_full = 0
        """The last step whose state was checked in full (0: none yet)."""
        self._last_results = StepResult(), StepResult()
        self._event_replay = EventReplay() if config.enable_kv_cache_events else None
        Lockstep.latest = self

    def step(self, op: Operation) -> tuple[StepResult, StepResult]:
        """Apply ``op`` to both; with checking on, raise the first invariant violation.

        With ``full_check_every`` N above 1, the state is checked in full every N steps and the
        other steps check only what the step returned (admission, the hit, the new blocks); call
        :meth:`finish` after the last step.  Any violation, wherever it shows, is reported as a
        full check of every step reports it: the trace is replayed, checked in full, to the first
        violation."""
        self.trace.append(op)
        Lockstep.total_steps += 1
        try:
            return self._step(op)
        except InvariantViolation as violation:
            raise self._first_violation(violation) from violation.__cause__

    def finish(self) -> None:
        """Check the state in full now, unless the last step was (at the end of a run)."""
        if self.check and self.checked_in_full < len(self.trace):
            try:
                self._check_in_full(self.trace[-1], *self._last_results)
            except InvariantViolation as violation:
                raise self._first_violation(violation) from violation.__cause__

    def _step(self, op: Operation) -> tuple[StepResult, StepResult]:
        step = len(self.trace)
        sut_result = self._on_target(op, lambda: self.target.apply(op))
        model_result = self.model.apply(op)
        if not self.check:
            return sut_result, model_result
        self._last_results = sut_result, model_result
        if step % self.full_check_every == 0:
            self._check_in_full(op, sut_result, model_result)
            return sut_result, model_result
        check_results(step, op, self.config, sut_result, model_result)
        if self.model.pipeline.steps:
            # A block read by a step in flight may be freed and handed out again before the step is
            # processed, and all come right by the next full check: while steps are in flight, the
            # target's own state is checked for it at every step (the model is not needed).
            in_flight_blocks_held(
                StepCheck(
                    step,
                    op,
                    self.config,
                    sut_result,
                    model_result,
                    self._on_target(op, self.target.observe),
                    NOT_OBSERVED,
                )
            )
        return sut_result, model_result

    def _on_target(self, op: Operation, call: Callable[[], T]) -> T:
        """``call()``, a call into the target; anything it raises but a violation (a differential
        target's disagreement) is the invariant ``target_raised``."""
        try:
            return call()
        except InvariantViolation:
            raise
        except Exception as exc:
            raise InvariantViolation(
                "target_raised", len(self.trace), describe_op(op), f"the target raised {type(exc).__name__}: {exc}"
            ) from exc

    def _check_in_full(self, op: Operation, sut_result: StepResult, model_result: StepResult) -> None:
        step = len(self.trace)
        sut = self._on_target(op, self.target.observe)
        model = self.model.observe()
        self.last = StepCheck(step, op, self.config, sut_result, model_result, sut, model, self._event_replay)
        self.checked_in_full = step
        check_all(self.last)
        try:
            self.target.check_internal()
        except AssertionError as exc:
            raise InvariantViolation(
                "target_self_check", step, describe_op(op), f"the target's own check failed: {exc}"
            ) from exc

    def _first_violation(self, found: InvariantViolation) -> InvariantViolation:
        """The violation a full check of every step reports first on this trace (``found`` itself
        when every step was checked in full)."""
        if self.full_check_every == 1:
            return found
        replay = Lockstep(self.make_target, self.config)
        try:
            for op in self.trace:
                replay.step(op)
        except InvariantViolation as first:
            return first
        finally:
            Lockstep.latest = self
        return found
