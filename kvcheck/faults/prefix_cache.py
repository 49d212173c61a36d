"""The prefix-cache map and eviction: the entries that point at blocks, and what drops them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import reuse_cached_blocks_by
from kvcore.block import KVBlock
from kvcore.errors import UnknownBlock
from kvcore.events import BlockRemoved

FAMILY = Family()


def plant_reused_block_leaves_map_entry(manager: kvcore.KVCacheManager) -> None:
    def forget_hash(block: KVBlock) -> None:
        # The bug: a reused cached block forgets its hash, but its entry
        # stays in the prefix-cache map, pointing at a block that now
        # holds other tokens.
        block.block_hash = None

    reuse_cached_blocks_by(manager.block_pool, forget_hash)


FAMILY.declare(
    FaultDeclaration(
        number=6,
        name="reused-block-leaves-map-entry",
        description=("allocating a cached free block clears its hash but leaves its prefix-cache map entry behind"),
        kvcore=plant_reused_block_leaves_map_entry,
    )
)


def plant_evict_skips_held_blocks(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def evict_blocks(block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        for block_id in ids:
            if not isinstance(block_id, int) or isinstance(block_id, bool) or not 0 <= block_id < pool.num_blocks:
                raise UnknownBlock(block_id=block_id, num_blocks=pool.num_blocks)
        for block_id in ids:
            block = pool.blocks[block_id]
            # The bug: only free blocks are evicted, on the theory that held
            # ones are dealt with when freed; a block whose external load
            # failed stays in the cache and is hit by the next request.
            if block.block_hash is not None and block.ref_cnt == 0:
                pool._evict(block)

    pool.evict_blocks = evict_blocks  # type: ignore[method-assign]


FAMILY.declare(
    FaultDeclaration(
        number=7,
        name="evict-skips-held-blocks",
        description=(
            "evict_blocks drops only free blocks' cache entries: a held block whose load failed stays hittable"
        ),
        kvcore=plant_evict_skips_held_blocks,
    )
)


def plant_partial_key_outlives_eviction(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def evict(block: KVBlock) -> None:
        assert block.block_hash is not None
        block_hash, group_id = block.block_hash
        pool.cache.pop(block.block_hash, block.block_id)
        block.block_hash = None
        # The bug: the block forgets its partial keys, but the map keeps them (a stale partial entry).
        pool._more_keys.pop(block.block_id, None)
        pool._partial_tokens.pop(block.block_id, None)
        pool.record_event(BlockRemoved((block_hash,), group_id))

    pool._evict = evict  # type: ignore[method-assign]


def plant_partial_key_outlives_eviction_in_vllm(manager: Any) -> None:
    pool = manager.block_pool

    def remove_cached_block_hashes(block: Any) -> list[Any]:
        removed = []
        if block.block_hash is not None and pool.cached_block_hash_to_block.pop(block.block_hash, block.block_id):
            removed.append(block.block_hash)
        # The bug: the block's partial keys are forgotten, not popped from the map.
        pool.cached_block_hashes_by_block.pop(block.block_id, None)
        block.reset_hash()
        return removed

    pool._remove_cached_block_hashes = remove_cached_block_hashes


FAMILY.declare(
    FaultDeclaration(
        number=32,
        name="partial-key-outlives-eviction",
        description=(
            "evicting a block drops its own key but leaves the partial key of a prompt boundary "
            "inside it in the prefix cache, pointing at a block that now holds other tokens"
        ),
        kvcore=plant_partial_key_outlives_eviction,
        vllm=VllmPlant(
            number=21,
            description=(
                "vLLM BlockPool._remove_cached_block_hashes popping a block's own hash but "
                "only forgetting its partial keys (left in the map)"
            ),
            plant=plant_partial_key_outlives_eviction_in_vllm,
        ),
    )
)
