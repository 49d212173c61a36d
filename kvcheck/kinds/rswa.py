"""R-SWA: the whole prompt and a window of generated tokens."""

from __future__ import annotations

import random

from kvcheck.kinds.base import HarnessKind, ceil_div
from kvcore.config import AttentionSpec, RSWASpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import rswa as model


class Rswa(HarnessKind):
    vllm_spec_name = "RSWASpec"
    vllm_window_field = "rswa_window"
    mixed_weight = 1
    # Half the local groups beside Mamba states: its hits inside its blocks need sub-block hits on as well.
    beside_states_weight = 2
    wide_beside_states = True

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        assert group.window is not None
        return RSWASpec(block_size, group.window)

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
        # The prompt and the window: every position up to the last new token but the whole blocks
        # between the prompt's last block and the block of the window's first token.
        assert group.window is not None
        end = ceil_div(num_computed_tokens + num_new_tokens, block_size)
        window_start = max(num_prompt_tokens, num_computed_tokens - group.window)
        gap = range(ceil_div(num_prompt_tokens, block_size), window_start // block_size)
        return tuple(p for p in range(end) if p not in gap)

    def draw(self, rng: random.Random, block_size: int) -> GroupSpec:
        return self.draw_short(rng, block_size)

    def draw_short(self, rng: random.Random, block_size: int) -> GroupSpec:
        # A window of generated tokens a block at most, so the gap opens in a short run.
        return self.group(window=rng.randint(1, block_size))

    def window_floor(self, block_size: int) -> int:
        return 1


RSWA = Rswa(model.RSWA)
KINDS = (RSWA,)
