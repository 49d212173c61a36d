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


RING = Ring("ring")
KINDS = (RING,)
