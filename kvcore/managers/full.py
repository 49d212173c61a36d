"""Full attention: every block is kept until the request is freed."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block_pool import BlockPool
from kvcore.blocks_math import ceil_div
from kvcore.config import AttentionSpec
from kvcore.hashing import BlockHash
from kvcore.managers.base import HitBlocks, SingleTypeManager, block_hashes_at, hash_boundary_event
from kvcore.request import Request


class FullAttentionManager(SingleTypeManager):
    """A hit is the longest run of cached blocks from the first block on.

    With blocks larger than the hash granularity (a hybrid cache of mixed
    block sizes), the prompt's last hash boundary short of its last token
    (of its last token, for a group that drops for a drafter) may fall inside
    a block: that block is also entered under the boundary's hash, a
    *partial* entry, once the tokens up to the boundary are cached.  With
    sub-block hits on (an ``alignment`` dividing the block size below it),
    a hit may go on into the first block not cached whole, up to the last
    hash boundary inside it that is cached (such a partial entry).
    """

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
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        # Hashes are chained, so the first miss ends the hit: no later block
        # can match once one has not.
        block_size = spec.block_size
        hit: HitBlocks = tuple([] for _ in group_ids)
        for block_hash in block_hashes_at(block_hashes, pool.hash_block_size, block_size)[: max_length // block_size]:
            cached = pool.get_cached_block(block_hash, group_ids)
            if cached is None:
                break
            for group_blocks, block in zip(hit, cached):
                group_blocks.append(block)
        hit_length = len(hit[0]) * block_size
        if alignment is not None and alignment < block_size and block_size % alignment == 0:
            # Sub-block hits: the hash boundaries inside the first block not cached whole, last first.
            first = len(hit[0]) * (block_size // alignment)
            end = min(first + block_size // alignment - 1, max_length // alignment, len(block_hashes))
            for index in range(end - 1, first - 1, -1):
                cached = pool.get_cached_block(block_hashes[index], group_ids)
                if cached is not None:
                    for group_blocks, block in zip(hit, cached):
                        group_blocks.append(block)
                    hit_length = (index + 1) * alignment
                    break
        if drop_last and hit_length:
            # An EAGLE drafter recomputes the last hit unit: a hash block with sub-block hits (the tail
            # block's tokens before it stay valid), else a block.
            hit_length -= min(alignment or block_size, block_size)
        hit_length -= hit_length % (alignment or block_size)
        for group_blocks in hit:
            del group_blocks[ceil_div(hit_length, block_size) :]
        return hit, hit_length

    def cache_blocks(self, request: Request, num_tokens: int, replay_boundaries: Sequence[int] = ()) -> None:
        super().cache_blocks(request, num_tokens, replay_boundaries)
        hash_block_size = self.pool.hash_block_size
        if hash_block_size is None or hash_block_size == self.block_size:
            return
        # The prompt's last hash boundary a later request can hit up to.
        token_limit = request.num_prompt_tokens if self.drops_hits else request.num_prompt_tokens - 1
        num_hashes = min(token_limit // hash_block_size, len(request.block_hashes))
        boundary = num_hashes * hash_block_size
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        table = self.req_to_blocks[request.request_id]
        position = boundary // self.block_size
        if position >= len(table):
            return
        block_hash = request.block_hashes[num_hashes - 1]
        if (
            self.pool.cache_partial_block(table[position], (block_hash, self.group_id), boundary)
            and self.pool.enable_kv_cache_events
        ):
            self.pool.record_event(hash_boundary_event(request, num_hashes, hash_block_size, self.group_id))
