"""Cross-attention: blocks for the encoder's tokens, taken as a request is scheduled from waiting,
outside the prefix cache."""

from __future__ import annotations

from kvmodel.kinds.base import Group, Kind


class CrossAttention(Kind):
    in_prefix_cache = False
    encoder_blocks = True
    caching_off_reason = "its blocks have no prefix cache (vLLM 0.33.0 fails the first lookup)"

    def needed_positions(self, group: Group, hit_blocks: int, block_size: int) -> range:
        return range(0)

    def slot_blocks(self, group: Group, num_tokens: int, block_size: int, encoder_blocks: int) -> int:
        return encoder_blocks


CROSS_ATTENTION = CrossAttention("cross_attention")
KINDS = (CROSS_ATTENTION,)
