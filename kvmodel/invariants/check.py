"""What an invariant looks at after a step (:class:`StepCheck`), and how it fails (:class:`InvariantViolation`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs

from kvmodel.config import TargetConfig
from kvmodel.observation import CacheEvent, Observation
from kvmodel.ops import Operation, StepResult, describe_op


@attrs.define(eq=False)
class EventReplay:
    """The target's KV cache event stream as replayed so far: the events taken and the (group, prefix)
    entries they leave.  A :class:`~kvcheck.lockstep.Lockstep` carries one from step to step, so
    :func:`events_match_cache` replays each new event once, not the whole stream at every step."""

    replayed: tuple[CacheEvent, ...] = ()
    view: Counter[tuple[int, tuple[int, ...]]] = attrs.Factory(Counter)

    def continues(self, events: tuple[CacheEvent, ...]) -> bool:
        """Whether ``events`` is the stream replayed so far with events appended (the prefix is compared
        in full: a target's events are the same objects from step to step, so this is quick)."""
        return events[: len(self.replayed)] == self.replayed

    def restart(self) -> None:
        self.replayed = ()
        self.view.clear()


@attrs.frozen
class StepCheck:
    """Everything the invariants may look at after one step.

    ``event_replay`` is the event stream replayed at the previous full check of the same run (``None``:
    replay it from the start)."""

    step: int
    op: Operation
    config: TargetConfig
    sut_result: StepResult
    model_result: StepResult
    sut: Observation
    model: Observation
    event_replay: EventReplay | None = None


@attrs.define(auto_exc=True, str=False)
class InvariantViolation(AssertionError):
    """An invariant failed after a step."""

    invariant: str
    step: int
    op: str
    detail: str
    expected: object = None
    actual: object = None

    def __str__(self) -> str:
        lines = [f"{self.invariant} violated at step {self.step} ({self.op}): {self.detail}"]
        if self.expected is not None or self.actual is not None:
            lines.append(f"  expected: {self.expected!r}")
            lines.append(f"  actual:   {self.actual!r}")
        return "\n".join(lines)


def fail(check: StepCheck, invariant: str, detail: str, expected: object = None, actual: object = None) -> None:
    raise InvariantViolation(invariant, check.step, describe_op(check.op), detail, expected, actual)


Invariant = Callable[[StepCheck], None]
