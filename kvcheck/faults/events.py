"""KV cache events: what the event queue reports of the blocks stored, removed and cleared."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import reuse_cached_blocks_by
from kvcheck.targets.vllm_internals import clear_cache_map, event_extra_keys, lookahead_token_ids
from kvcheck.targets.vllm_target import require_vllm
from kvcore.block import KVBlock

FAMILY = Family()


def plant_evicted_block_removal_unreported(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def drop_entry_quietly(block: KVBlock) -> None:
        # The bug: the reused block's entry is dropped here directly, not
        # through the eviction path that queues its BlockRemoved; an
        # external cache keeps routing the prefix to this block.
        assert block.block_hash is not None
        pool.cache.pop(block.block_hash, block.block_id)
        block.block_hash = None

    reuse_cached_blocks_by(pool, drop_entry_quietly)


def _pools(manager: Any) -> list[Any]:
    """Every block pool of this manager (its groups' managers may hold their own), each once."""
    managers = manager.coordinator.single_type_managers
    return list(dict.fromkeys([manager.block_pool, *(m.block_pool for m in managers)]))


def plant_evicted_block_removal_unreported_in_vllm(manager: Any) -> None:
    for pool in _pools(manager):

        def get_new_blocks(num_blocks: int, pool: Any = pool) -> list[Any]:
            if num_blocks > pool.get_num_free_blocks():
                raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
            ret: list[Any] = pool.free_block_queue.popleft_n(num_blocks)
            if pool._reuse_watchers:
                pool._notify_reuse(ret)
            for block in ret:
                if pool.enable_caching:
                    if pool.metrics_collector:
                        pool.metrics_collector.on_block_evicted(block)
                    # The bug: the reused block's hashes are dropped directly, not
                    # through _maybe_evict_cached_block, which reports them: no
                    # BlockRemoved is queued.
                    pool._remove_cached_block_hashes(block)
                assert block.ref_cnt == 0
                block.ref_cnt += 1
                if pool.metrics_collector:
                    pool.metrics_collector.on_block_allocated(block)
            return ret

        pool.get_new_blocks = get_new_blocks


FAMILY.declare(
    FaultDeclaration(
        number=21,
        name="evicted-block-removal-unreported",
        description=(
            "get_new_blocks drops a reused cached block's entry directly, not through the eviction "
            "path: no BlockRemoved is queued"
        ),
        kvcore=plant_evicted_block_removal_unreported,
        vllm=VllmPlant(
            number=11,
            description=(
                "vLLM get_new_blocks dropping a reused cached block's hashes without queuing its BlockRemoved"
            ),
            plant=plant_evicted_block_removal_unreported_in_vllm,
        ),
    )
)


def plant_stored_event_repeats_cached_blocks(manager: kvcore.KVCacheManager) -> None:
    for group_manager in manager.coordinator.managers:
        stored_event = group_manager._stored_event

        def stored_event_from_the_start(
            request: kvcore.Request,
            num_cached: int,
            num_full: int,
            positions: Sequence[int],
            stored_event: Any = stored_event,
            group_manager: Any = group_manager,
        ) -> kvcore.BlockStored:
            # The bug: the event is built for every full block from position 0
            # (parent None), not for the blocks this call newly cached; a
            # consumer counts the blocks cached before as stored twice.
            table = group_manager.req_to_blocks[request.request_id]
            earlier = [p for p in range(num_cached) if table[p].block_hash is not None]
            return stored_event(request, 0, num_full, [*earlier, *positions])  # type: ignore[no-any-return]

        group_manager._stored_event = stored_event_from_the_start  # type: ignore[method-assign]


def plant_stored_event_repeats_cached_blocks_in_vllm(manager: Any) -> None:
    from vllm.distributed.kv_events import BlockStored
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash, resolve_block_hashes

    release = require_vllm().release
    for pool in _pools(manager):
        cache_full_blocks = pool.cache_full_blocks

        def cache_full_blocks_reported_from_the_start(
            request: Any,
            blocks: list[Any],
            num_cached_blocks: int,
            num_full_blocks: int,
            block_size: int,
            kv_cache_group_id: int,
            block_mask: list[bool] | None = None,
            pool: Any = pool,
            cache_full_blocks: Any = cache_full_blocks,
        ) -> None:
            queued = len(pool.kv_event_queue)
            cache_full_blocks(
                request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, block_mask
            )
            if len(pool.kv_event_queue) == queued or not isinstance(pool.kv_event_queue[-1], BlockStored):
                return
            # The bug: the event is built for every full block from position 0
            # (parent None), not for the blocks this call newly cached; a
            # consumer counts the blocks cached before as stored twice.
            block_hashes = resolve_block_hashes(request.block_hashes, pool.hash_block_size, block_size)
            positions = [
                i
                for i in range(num_full_blocks)
                if not blocks[i].is_null
                and (i < num_cached_blocks or block_mask is None or block_mask[i - num_cached_blocks])
            ]
            extra_keys_list = []
            curr_mm_idx = 0
            extra_keys_of = event_extra_keys(pool, release)
            for i in positions:
                extra_keys, curr_mm_idx = extra_keys_of(request, i * block_size, (i + 1) * block_size, curr_mm_idx)
                extra_keys_list.append(extra_keys)
            pool.kv_event_queue[-1] = pool._build_block_stored_event(
                request,
                block_hashes=[maybe_convert_block_hash(block_hashes[i]) for i in positions],
                parent_block_hash=None,
                start_token_idx=0,
                end_token_idx=num_full_blocks * block_size,
                block_size=block_size,
                kv_cache_group_id=kv_cache_group_id,
                extra_keys_list=extra_keys_list,
                lookahead_token_ids=[
                    lookahead_token_ids(pool, release)(request, (i + 1) * block_size) for i in positions
                ]
                if pool.num_hash_lookahead_tokens
                else None,
            )

        pool.cache_full_blocks = cache_full_blocks_reported_from_the_start


FAMILY.declare(
    FaultDeclaration(
        number=22,
        name="stored-event-repeats-cached-blocks",
        description=(
            "a caching call's BlockStored lists every full block from position 0 (parent None), "
            "not only the blocks it newly cached: blocks cached before are reported stored twice"
        ),
        kvcore=plant_stored_event_repeats_cached_blocks,
        vllm=VllmPlant(
            number=12,
            description=(
                "vLLM cache_full_blocks reporting every full block from position 0 in its "
                "BlockStored, not only the newly cached ones"
            ),
            plant=plant_stored_event_repeats_cached_blocks_in_vllm,
        ),
    )
)


def plant_reset_unreported(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def reset_prefix_cache() -> bool:
        if pool.free_queue.num_free != pool.num_blocks - 1:
            return False
        pool.cache.clear()
        for block in pool.blocks:
            block.block_hash = None
        # The bug: no AllBlocksCleared is queued; an external cache keeps
        # every prefix the reset dropped.
        return True

    pool.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]


def plant_reset_unreported_in_vllm(manager: Any) -> None:
    release = require_vllm().release
    for pool in _pools(manager):

        def reset_prefix_cache(pool: Any = pool) -> bool:
            if pool.num_gpu_blocks - pool.get_num_free_blocks() != 1:  # the null block is always used
                return False
            clear_cache_map(pool, release)
            pool.cached_block_hashes_by_block.clear()
            if pool._reuse_watchers:
                pool._notify_reuse([pool.blocks[block_id] for block_id in list(pool._reuse_watchers)])
            for block in pool.blocks:
                block.reset_hash()
            if pool.metrics_collector:
                pool.metrics_collector.reset()
            # The bug: no AllBlocksCleared is queued; an external cache keeps
            # every prefix the reset dropped.
            return True

        pool.reset_prefix_cache = reset_prefix_cache


FAMILY.declare(
    FaultDeclaration(
        number=23,
        name="reset-unreported",
        description="reset_prefix_cache empties the prefix cache but queues no AllBlocksCleared",
        kvcore=plant_reset_unreported,
        vllm=VllmPlant(
            number=13,
            description=("vLLM reset_prefix_cache emptying the prefix cache without queuing AllBlocksCleared"),
            plant=plant_reset_unreported_in_vllm,
        ),
    )
)
