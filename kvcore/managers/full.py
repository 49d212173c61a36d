"""Full attention: every block is kept until the request is freed."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block_pool import BlockPool
from kvcore.config import AttentionSpec
from kvcore.hashing import BlockHash
from kvcore.managers.base import HitBlocks, SingleTypeManager, drop_last_block


class FullAttentionManager(SingleTypeManager):
    """A hit is the longest run of cached blocks from the first block on."""

    kind = "full"

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: BlockPool,
        spec: AttentionSpec,
        drop_last: bool = False,
    ) -> tuple[HitBlocks, int]:
        # Hashes are chained, so the first miss ends the hit: no later block
        # can match once one has not.
        hit: HitBlocks = tuple([] for _ in group_ids)
        for block_hash in block_hashes[: max_length // spec.block_size]:
            cached = pool.get_cached_block(block_hash, group_ids)
            if cached is None:
                break
            for group_blocks, block in zip(hit, cached):
                group_blocks.append(block)
        if drop_last:
            drop_last_block(hit)
        return hit, len(hit[0]) * spec.block_size
