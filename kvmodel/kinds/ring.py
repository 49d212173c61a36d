"""A ring buffer: one scratch block per request, outside the prefix cache, never zeroed."""

from __future__ import annotations

from kvmodel.kinds.base import Group, Kind


class Ring(Kind):
    in_prefix_cache = False
    scratch_block = True

    def needed_positions(self, group: Group, hit_blocks: int, block_size: int) -> range:
        return range(0)

    def slot_blocks(self, group: Group, num_tokens: int, block_size: int, encoder_blocks: int) -> int:
        return 1

    def step_positions(
        self,
        group: Group,
        block_size: int,
        num_computed_tokens: int,
        num_new_tokens: int,
        num_prompt_tokens: int,
        num_encoder_tokens: int,
        state_tokens: int | None,
    ) -> tuple[int, ...]:
        return (0,)


RING = Ring("ring")
KINDS = (RING,)
