"""Cross-attention: blocks for the encoder's tokens."""

from __future__ import annotations

from kvcheck.kinds.base import HarnessKind, ceil_div
from kvcore.config import AttentionSpec, CrossAttentionSpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import cross_attention as model


class CrossAttention(HarnessKind):
    vllm_spec_name = "CrossAttentionSpec"
    # Full attention would leave the encoder's tokens without a group to hold them.
    shrinks_to_full = False

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        return CrossAttentionSpec(block_size)

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
        return tuple(range(ceil_div(num_encoder_tokens, block_size)))


CROSS_ATTENTION = CrossAttention(model.CROSS_ATTENTION)
KINDS = (CROSS_ATTENTION,)
