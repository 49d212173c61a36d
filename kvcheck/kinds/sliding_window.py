"""Sliding-window attention, plain and over MLA's latent vectors (a spec of its own)."""

from __future__ import annotations

import random

from kvcheck.kinds.base import HarnessKind
from kvcore.config import AttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import sliding_window as model


class SlidingWindow(HarnessKind):
    vllm_spec_name = "SlidingWindowSpec"
    vllm_window_field = "sliding_window"
    mixed_weight = 1
    beside_states_weight = 1

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        assert group.window is not None
        return SlidingWindowSpec(block_size, group.window)

    def first_read_token(self, group: GroupSpec, num_computed_tokens: int) -> int:
        # The next token reads the window's tokens before it, itself included.
        assert group.window is not None
        return max(0, num_computed_tokens - group.window + 1)

    def draw(self, rng: random.Random, block_size: int) -> GroupSpec:
        # Short windows slide within a short run; long ones keep hits intact.  One in four is over
        # MLA's latent vectors (a spec of its own).
        kind = SLIDING_WINDOW_MLA if rng.random() < 1 / 4 else self
        return kind.group(window=rng.randint(2, rng.choice([4, 16]) * block_size))

    def draw_short(self, rng: random.Random, block_size: int) -> GroupSpec:
        return self.group(window=rng.randint(2, 4 * block_size))

    def window_floor(self, block_size: int) -> int:
        return 2


class SlidingWindowMla(SlidingWindow):
    vllm_spec_name = "SlidingWindowMLASpec"
    mixed_weight = 0
    beside_states_weight = 0

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        assert group.window is not None
        return SlidingWindowMLASpec(block_size, group.window)


SLIDING_WINDOW = SlidingWindow(model.SLIDING_WINDOW)
SLIDING_WINDOW_MLA = SlidingWindowMla(model.SLIDING_WINDOW_MLA)
KINDS = (SLIDING_WINDOW, SLIDING_WINDOW_MLA)
