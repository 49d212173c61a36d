"""The vLLM block-pool target: vLLM 0.33.0's ``BlockPool`` driven by block ids and small-int keys."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kvcheck.targets.vllm_queue import backward_ids, check_free_list, forward_ids
from kvcheck.targets.vllm_target import cache_map, make_block_pool, require_vllm

PoolEntry = tuple[int, int, int]
"""A prefix-cache entry as (group id, key token, block id)."""

HASH_BLOCK_SIZE = 1
"""Each key stands for one block's hash; the pool hashes (and caches) one block per key."""


class VllmPool:
    """vLLM's block pool, whose blocks are named by id and whose cache keys are small ints.

    Blocks are entered in the cache the way vLLM's managers do it, through
    ``cache_full_blocks`` with a request that carries the keys' hashes.
    vLLM re-enters an already cached block only when a partial block becomes
    full, so this target does not accept blocks that are cached already
    (``moves_cached_blocks``): the block-pool machine leaves re-keying out.
    """

    name = "vllm"
    moves_cached_blocks = False

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self._v = require_vllm()
        self.pool = make_block_pool(num_blocks, enable_caching, HASH_BLOCK_SIZE)
        self._key_of_hash: dict[bytes, int] = {}

    def _hash(self, key: int) -> bytes:
        block_hash = hashlib.sha256(b"kvcheck/pool-key/%d" % key).digest()
        self._key_of_hash[block_hash] = key
        return block_hash

    def _blocks(self, block_ids: Sequence[int]) -> list[Any]:
        return [self.pool.blocks[block_id] for block_id in block_ids]

    # -- operations -----------------------------------------------------------

    def get_new_blocks(self, n_blocks: int) -> list[int] | None:
        """Allocate ``n_blocks`` from the head; ``None`` if the pool refused (fewer free).

        vLLM refuses with a ``ValueError`` raised before anything changes.
        """
        try:
            blocks = self.pool.get_new_blocks(n_blocks)
        except ValueError:
            return None
        return [block.block_id for block in blocks]

    def touch(self, block_ids: Sequence[int]) -> None:
        self.pool.touch(self._blocks(block_ids))

    def free(self, block_ids_in_eviction_order: Sequence[int]) -> None:
        self.pool.free_blocks(self._blocks(block_ids_in_eviction_order))

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

    def lookup(self, key: int, group_id: int) -> int | None:
        """The block a prefix hit on ``key`` in ``group_id`` returns, or ``None``."""
        found = self.pool.get_cached_block(self._hash(key), [group_id])
        return None if found is None else int(found[0].block_id)

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
        return {block.block_id: block.ref_cnt for block in self.pool.blocks[1:]}

    def cache_entries(self) -> frozenset[PoolEntry]:
        return frozenset(
            (self._v.get_group_id(key), self._key_of_hash[self._v.get_block_hash(key)], block_id)
            for key, block_id in cache_map(self.pool)
        )

    def check_internal(self) -> None:
        """vLLM's pool has no self-check: its free list is walked, and the null block must stay out of it."""
        check_free_list(self.pool.free_block_queue)
        null = self.pool.null_block
        assert null.block_id == 0 and null.is_null, f"the null block is block {null.block_id} (is_null={null.is_null})"
        assert null.prev_free_block is None and null.next_free_block is None, "the null block is in the free queue"
