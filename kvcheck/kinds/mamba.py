"""Mamba state groups: vLLM's ``none`` cache mode and its ``align`` mode, both vLLM's ``MambaSpec``."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from kvcheck.kinds.base import HarnessKind, ceil_div
from kvcore.config import AttentionSpec, MambaSpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import mamba as model


class Mamba(HarnessKind):
    """The ``none`` cache mode."""

    vllm_spec_name = "MambaSpec"
    mamba_cache_mode = "none"

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        return MambaSpec(block_size, group.speculative_blocks)

    def first_read_token(self, group: GroupSpec, num_computed_tokens: int) -> int:
        # The state after the last computed token.
        return max(0, num_computed_tokens - 1)

    def vllm_spec(self, v: Any, group: GroupSpec, layout: Mapping[str, Any]) -> Any:
        # One small state tensor; the allocator reads only the block size, the mode, the speculative blocks
        # and the prefill checkpoints.
        alignment = group.prefill_checkpoint_alignment
        return getattr(v, self.vllm_spec_name)(
            shapes=((1,),),
            dtypes=(v.dtype,),
            block_size=layout["block_size"],
            mamba_cache_mode=self.mamba_cache_mode,
            num_speculative_blocks=group.speculative_blocks,
            num_prefill_checkpoint_blocks=int(alignment is not None),
            prefill_checkpoint_alignment=alignment,
        )

    def draw(self, rng: random.Random, block_size: int) -> GroupSpec:
        # Blocks reserved for an MTP verifier's draft states in three draws in four.
        return self.group(speculative_blocks=rng.choice([0, 1, 1, 2]))


class MambaAlign(Mamba):
    """The ``align`` cache mode."""

    mamba_cache_mode = "align"

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        alignment = group.prefill_checkpoint_alignment
        return MambaSpec(
            block_size,
            group.speculative_blocks,
            cache_mode="align",
            num_prefill_checkpoint_blocks=int(alignment is not None),
            prefill_checkpoint_alignment=alignment,
        )

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
        # The state it starts from and the block of its last token; the positions between are null.
        end = ceil_div(num_computed_tokens + num_new_tokens, block_size)
        start_state = ceil_div(num_computed_tokens if state_tokens is None else state_tokens, block_size) - 1
        return tuple(sorted({p for p in (start_state, end - 1) if p >= 0}))


MAMBA = Mamba(model.MAMBA)
ALIGN = MambaAlign(model.ALIGN)
KINDS = (MAMBA, ALIGN)
