"""A differential target: two allocators driven with identical operations, compared after every step."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvcheck.targets.interface import Target, TargetFactory
from kvcheck.vllm_releases import semantics_in_force
from kvmodel.config import TargetConfig
from kvmodel.invariants import InvariantViolation
from kvmodel.observation import Observation
from kvmodel.ops import Operation, StepResult, describe_op

COMPARED_FIELDS = ("tables", "free_order", "ref_counts", "cache_entries", "events")


class DifferentialTarget:
    """Applies each operation to every target and reports the first one's state.

    After every step the step results (allocation success, hit length and
    blocks, new blocks, reset outcome) and the observed tables, free order,
    ref counts, cache entries and KV cache event streams must be equal; otherwise the step fails
    ``targets_agree``, naming both targets and the first differing field.
    """

    def __init__(self, config: TargetConfig, factories: Sequence[tuple[str, TargetFactory]]) -> None:
        self.names = [name for name, _ in factories]
        self.targets: list[Target] = [factory(config) for _, factory in factories]
        self.name = "+".join(self.names)
        self.step = 0
        semantics = semantics_in_force()
        # On semantics not confirmed for the installed vLLM, a divergence may be vLLM's new behaviour.
        self._drift = (
            f": a bug or a semantic drift of vLLM {semantics.installed}"
            if "vllm" in self.names and semantics.unconfirmed is not None
            else ""
        )

    def _disagree(self, op: Operation, field: str, first: object, other: object, other_name: str) -> InvariantViolation:
        return InvariantViolation(
            "targets_agree",
            self.step,
            describe_op(op),
            f"{field} differs between {self.names[0]} (expected) and {other_name} (actual){self._drift}",
            first,
            other,
        )

    def apply(self, op: Operation) -> StepResult:
        self.step += 1
        self._last_op = op
        results = [target.apply(op) for target in self.targets]
        for name, result in zip(self.names[1:], results[1:]):
            for field in attrs.fields(StepResult):
                if getattr(result, field.name) != getattr(results[0], field.name):
                    raise self._disagree(
                        op, field.name, getattr(results[0], field.name), getattr(result, field.name), name
                    )
        return results[0]

    def observe(self) -> Observation:
        observations = [target.observe() for target in self.targets]
        for name, observation in zip(self.names[1:], observations[1:]):
            for field in COMPARED_FIELDS:
                if getattr(observation, field) != getattr(observations[0], field):
                    raise self._disagree(
                        self._last_op, field, getattr(observations[0], field), getattr(observation, field), name
                    )
        return observations[0]

    def check_internal(self) -> None:
        for target in self.targets:
            target.check_internal()
