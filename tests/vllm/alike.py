"""Scenarios stepped in lockstep on kvcore, vLLM and the model."""

from __future__ import annotations

from collections.abc import Sequence

from kvcheck.lockstep import Lockstep
from kvcheck.targets import load_target
from kvmodel.config import TargetConfig
from kvmodel.ops import Operation, StepResult


def run_alike(config: TargetConfig, ops: Sequence[Operation]) -> tuple[Lockstep, list[StepResult]]:
    """Each operation on kvcore, vLLM and the model, every invariant checked after every step (any
    divergence raises); the lockstep, and every step's result."""
    lockstep = Lockstep(load_target("kvcore+vllm"), config.validate())
    return lockstep, [lockstep.step(op)[0] for op in ops]
