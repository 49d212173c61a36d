"""The interface every target implements: an allocator under test, built from a configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvmodel.config import TargetConfig
from kvmodel.observation import Observation
from kvmodel.ops import Operation, StepResult


class Target(Protocol):
    """An allocator under test."""

    name: str

    def apply(self, op: Operation) -> StepResult:
        """Carry out one operation."""
        ...

    def observe(self) -> Observation:
        """The current state, as block ids and token prefixes."""
        ...

    def check_internal(self) -> None:
        """The allocator's own structural self-check (may do nothing); raises AssertionError."""
        ...


TargetFactory = Callable[[TargetConfig], Target]
