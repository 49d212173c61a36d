"""Chunked local attention: its window is an attention chunk, a whole number of blocks."""

from __future__ import annotations

import random

from kvcheck.kinds.base import HarnessKind
from kvcore.config import AttentionSpec, ChunkedLocalAttentionSpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import chunked_local as model


class ChunkedLocal(HarnessKind):
    vllm_spec_name = "ChunkedLocalAttentionSpec"
    vllm_window_field = "attention_chunk_size"
    mixed_weight = 1
    beside_states_weight = 1

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        assert group.window is not None
        return ChunkedLocalAttentionSpec(block_size, group.window)

    def first_read_token(self, group: GroupSpec, num_computed_tokens: int) -> int:
        # The next token reads its own chunk from the chunk's first token.
        assert group.window is not None
        return num_computed_tokens - num_computed_tokens % group.window

    def draw(self, rng: random.Random, block_size: int) -> GroupSpec:
        return self.group(window=block_size * rng.randint(1, rng.choice([4, 16])))

    def draw_short(self, rng: random.Random, block_size: int) -> GroupSpec:
        return self.group(window=block_size * rng.randint(1, 4))

    def window_floor(self, block_size: int) -> int:
        return block_size

    def window_step(self, block_size: int) -> int:
        return block_size


CHUNKED_LOCAL = ChunkedLocal(model.CHUNKED_LOCAL)
KINDS = (CHUNKED_LOCAL,)
