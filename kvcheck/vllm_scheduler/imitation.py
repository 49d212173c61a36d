"""kvcheck's own scheduler held to vLLM's.

The operations a workload's run through vLLM's scheduler amounts to are replayed through kvcheck's
scheduler (:class:`~kvcheck.targets.vllm_target.VllmTarget`) on a fresh vLLM manager, its calls read by
the same :class:`~kvcheck.vllm_scheduler.recorder.CallRecorder`.  Each operation must make the calls
vLLM's scheduler made for it, with the same arguments and results; the first one that does not is an
imitation gap: kvcheck's scheduler makes a call sequence vLLM's does not, or not with those arguments.
"""

from __future__ import annotations

import attrs

from kvcheck.targets.vllm_target import VllmTarget
from kvcheck.vllm_scheduler.engine import SchedulerRecord
from kvcheck.vllm_scheduler.recorder import Call, CallRecorder
from kvmodel.ops import AddRequest, Finish, Operation, Schedule, StepResult, describe_op


@attrs.frozen
class ImitationGap:
    """Operation ``position`` (counted from 1) of the record: what vLLM's scheduler did for it, and what
    kvcheck's scheduler did."""

    position: int
    op: Operation
    real: Made
    imitated: Made

    def __str__(self) -> str:
        def made(what: Made) -> str:
            return "; ".join(f"{describe_op(op)} -> {result} by {calls}" for op, result, calls in what) or "no call"

        return (
            f"operation {self.position} ({describe_op(self.op)}): vLLM's scheduler made {made(self.real)}; "
            f"kvcheck's scheduler {made(self.imitated)}"
        )


Made = tuple[tuple[Operation, StepResult, tuple[Call, ...]], ...]
"""What a scheduler did for an operation: the operations its calls amount to, each with its result
and its calls."""


def _comparable(op: Operation) -> Operation:
    # The recorder cannot know a step's sampled token; the operation handed over carries it.
    return attrs.evolve(op, sampled_token=0) if isinstance(op, Schedule) else op


def imitation_gap(record: SchedulerRecord) -> ImitationGap | None:
    """The first operation of ``record`` whose calls through kvcheck's scheduler differ from vLLM's."""
    target = VllmTarget(record.config)
    recorder = CallRecorder(target.manager, len(record.config.groups))
    position = 0
    for step in record.steps:
        for op, result, calls in zip(step.ops, step.results, step.calls, strict=True):
            position += 1
            recorder.phase = "output" if isinstance(op, Finish) else "schedule"
            target.apply(op)
            taken = recorder.take()
            real: Made = () if isinstance(op, AddRequest) else ((_comparable(op), result, calls),)
            imitated: Made = tuple(
                (_comparable(o), r, c) for o, r, c in zip(taken.ops, taken.results, taken.calls, strict=True)
            )
            if imitated != real:
                return ImitationGap(position, op, real, imitated)
    return None
