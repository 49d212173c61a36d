"""The vLLM block-pool target: vLLM's ``BlockPool`` driven by block ids and small-int keys."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from kvcheck.targets.id_named_pool import IdNamedPool, PoolEntry
from kvcheck.targets.vllm_internals import (
    backward_ids,
    cache_entries,
    check_free_list,
    check_null_block,
    forward_ids,
    ref_counts,
)
from kvcheck.targets.vllm_target import make_block_pool, require_vllm

HASH_BLOCK_SIZE = 1
"""Each key stands for one block's hash; the pool hashes (and caches) one block per key."""


class VllmPool(IdNamedPool):
    """vLLM's block pool, whose blocks are named by id and whose cache keys are small ints.

    Blocks are entered in the cache the way vLLM's managers do it, through
    ``cache_full_blocks`` with a request that carries the keys' hashes.
    vLLM re-enters an already cached block only when a partial block becomes
    full, so this target does not accept blocks that are cached already
    (``moves_cached_blocks``): the block-pool machine leaves re-keying out.
    """

    name = "vllm"
    moves_cached_blocks = False
    refusal = ValueError

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self._v = require_vllm()
        super().__init__(make_block_pool(num_blocks, enable_caching, HASH_BLOCK_SIZE))

    # -- operations -----------------------------------------------------------

    def cache(self, block_ids: Sequence[int], keys: Sequence[int], group_id: int) -> None:
        request = SimpleNamespace(request_id="kvcheck-pool", block_hashes=[self._hash(key) for key in keys])
        self.pool.cache_full_blocks(
            request,
            self._blocks(block_ids),
            num_cached_blocks=0,
            num_full_blocks=len(block_ids),
            block_size=HASH_BLOCK_SIZE,
            kv_cache_group_id=group_id,
        )

    def evict(self, block_ids: Sequence[int]) -> None:
        self.pool.evict_blocks(set(block_ids))

    def reset(self) -> bool:
        return bool(self.pool.reset_prefix_cache())

    # -- observation ----------------------------------------------------------

    def free_order(self) -> list[int]:
        """The free queue walked head (next to allocate) to tail."""
        return forward_ids(self.pool.free_block_queue)

    def free_order_from_tail(self) -> list[int]:
        return backward_ids(self.pool.free_block_queue)

    @property
    def num_free(self) -> int:
        return int(self.pool.get_num_free_blocks())

    def ref_counts(self) -> dict[int, int]:
        """``ref_cnt`` of every block but the null block."""
        return ref_counts(self.pool)

    def cache_entries(self) -> frozenset[PoolEntry]:
        return frozenset(
            (self._v.get_group_id(key), self._key_of_hash[self._v.get_block_hash(key)], block_id)
            for key, block_id in cache_entries(self.pool, self._v.version)
        )

    def check_internal(self) -> None:
        """vLLM's pool has no self-check: its free list is walked, and the null block must stay out of it."""
        check_free_list(self.pool.free_block_queue)
        check_null_block(self.pool)
