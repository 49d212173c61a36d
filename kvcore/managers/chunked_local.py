"""Chunked local attention: blocks before the current chunk are freed."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block_pool import BlockPool
from kvcore.blocks_math import ceil_div
from kvcore.config import AttentionSpec, ChunkedLocalAttentionSpec
from kvcore.errors import InvalidArgument
from kvcore.hashing import BlockHash
from kvcore.managers.base import HitBlocks, SingleTypeManager, block_hashes_at


class ChunkedLocalAttentionManager(SingleTypeManager):
    """A token attends only to the earlier tokens of its own ``attention_chunk_size`` chunk.

    After ``n`` tokens are computed, every token before the chunk that holds
    token ``n`` is skipped: ``(n // chunk) * chunk`` tokens.
    """

    kind = "chunked_local"
    spec: ChunkedLocalAttentionSpec

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        chunk = self.spec.attention_chunk_size
        return (num_computed_tokens // chunk) * chunk

    def admission_cap(self, max_in_flight_tokens: int, max_model_len: int | None, block_size: int) -> int | None:
        # One chunk plus the tokens in flight.
        num_tokens = self.spec.attention_chunk_size + max_in_flight_tokens
        if max_model_len is not None:
            num_tokens = min(num_tokens, max_model_len)
        return ceil_div(num_tokens, block_size)

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: BlockPool,
        spec: AttentionSpec,
        drop_last: bool = False,
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        """Blocks before the chunk holding token ``max_length`` count as hit (null blocks);
        from that chunk's start on, the hit extends over consecutively cached blocks.  A hit
        cannot drop its last block here (``KVCacheConfig`` refuses EAGLE with this type)."""
        assert isinstance(spec, ChunkedLocalAttentionSpec)
        if drop_last:
            raise InvalidArgument("drop_last", drop_last, "chunked local attention cannot drop a hit block")
        block_size = spec.block_size
        # KVCacheConfig refuses a hybrid cache that would align this type's hits to another size.
        assert alignment in (None, block_size), f"chunked local hits align to the block size, not {alignment}"
        chunk = spec.attention_chunk_size
        block_hashes = block_hashes_at(block_hashes, pool.hash_block_size, block_size)
        max_num_blocks = max_length // block_size
        window_start_tokens = (max_length // chunk) * chunk if max_length > 0 else 0
        window_start_block = window_start_tokens // block_size
        hit: HitBlocks = tuple([pool.null_block] * window_start_block for _ in group_ids)
        for i in range(window_start_block, max_num_blocks):
            cached = pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                break
            for group_blocks, block in zip(hit, cached):
                group_blocks.append(block)
        return hit, len(hit[0]) * block_size
