"""A ring buffer: one scratch block per request."""

from __future__ import annotations

from kvcheck.kinds.base import HarnessKind
from kvcore.config import AttentionSpec, CircularBufferSpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import ring as model


class Ring(HarnessKind):
    vllm_spec_name = "CircularBufferSpec"
    mixed_weight = 1

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        return CircularBufferSpec(block_size)

    def step_positions(
        self,
        group: GroupSpec,
        block_size: int,
        num_computed_tokens: int,
        num_new_tokens: int,
        num_prompt_tokens: int,
        num_encoder_tokens: int,
        state_tokens: int | None,
    ) -> tuple[int, ...]:
        return (0,)


RING = Ring(model.RING)
KINDS = (RING,)
