"""Mamba state groups: vLLM's ``none`` cache mode (the block holding the last computed token's state
is kept, every one before it freed) and its ``align`` mode (position ``p`` holds the state after
``(p + 1) * block_size`` tokens, full blocks' states are prefix-cached and a hit needs only its last
state)."""

from __future__ import annotations

from typing import ClassVar

from kvmodel.kinds.base import Group, Kind


class Mamba(Kind):
    """The ``none`` cache mode."""

    holds_state = True
    caching_off_reason: ClassVar[str | None] = (
        "its 'none' cache mode caches no state (vLLM 0.33.0 asserts: prefix caching needs the 'align' mode)"
    )

    def first_attended_token(self, group: Group, num_computed_tokens: int) -> int:
        # The state after the last computed token.
        return max(0, num_computed_tokens - 1)


class MambaAlign(Mamba):
    """The ``align`` cache mode."""

    aligned_states = True
    caching_off_reason = None

    def needed_positions(self, group: Group, hit_blocks: int, block_size: int) -> range:
        return range(hit_blocks - 1, hit_blocks) if hit_blocks else range(0)


MAMBA = Mamba("mamba")
ALIGN = MambaAlign("mamba_align")
KINDS = (MAMBA, ALIGN)
