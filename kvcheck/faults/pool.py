"""The free queue and the block pool: which blocks a free releases, in which order freed blocks are
reused, and what a reset empties.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcore.block import KVBlock
from kvcore.events import AllBlocksCleared

FAMILY = Family()


def release_with_and_condition(blocks: Iterable[Any], enable_caching: bool) -> tuple[list[Any], list[Any]]:
    """Drop one reference on each block; route the freed ones with the seed-000 condition.

    The seed bug: ``hash is None and caching_on`` where ``hash is None or not
    caching_on`` was meant, so with caching off every freed block goes to the
    tail (FIFO reuse).  Works on kvcore's and vLLM's blocks alike; returns
    (blocks for the head, blocks for the tail).
    """
    to_head, to_tail = [], []
    for block in blocks:
        if block.is_null:
            continue
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            if block.block_hash is None and enable_caching:
                to_head.append(block)
            else:
                to_tail.append(block)
    return to_head, to_tail


def plant_fifo_reuse_when_caching_off(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def free_blocks(blocks_in_eviction_order: Iterable[KVBlock]) -> None:
        to_head, to_tail = release_with_and_condition(blocks_in_eviction_order, pool.enable_caching)
        pool.free_queue.prepend_n(to_head)
        pool.free_queue.append_n(to_tail)

    # The planted copy has no evict_first parameter (kvcore never passes it).
    pool.free_blocks = free_blocks  # type: ignore[method-assign, assignment]


def plant_fifo_reuse_when_caching_off_in_vllm(manager: Any) -> None:
    pool = manager.block_pool

    def free_blocks(ordered_blocks: Any) -> None:
        # vLLM PR #48017 as merged.
        to_head, to_tail = release_with_and_condition(ordered_blocks, pool.enable_caching)
        pool.free_block_queue.prepend_n(to_head)
        pool.free_block_queue.append_n(to_tail)

    pool.free_blocks = free_blocks


FAMILY.declare(
    FaultDeclaration(
        number=1,
        name="fifo-reuse-when-caching-off",
        description=(
            "free_blocks routes freed blocks by `hash is None and caching_on`: with caching off, reuse turns FIFO"
        ),
        kvcore=plant_fifo_reuse_when_caching_off,
        vllm=VllmPlant(
            number=1,
            description="vLLM BlockPool.free_blocks with `hash is None and enable_caching` (seed 000)",
            plant=plant_fifo_reuse_when_caching_off_in_vllm,
        ),
    )
)


def plant_touch_leaves_free_block_queued(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def touch(blocks: Iterable[KVBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue
            # The bug: the reference is taken, but a hit block that sat free
            # (ref_cnt 0) is not removed from the free queue, so it can be
            # handed out again while a request holds it.
            block.ref_cnt += 1

    pool.touch = touch  # type: ignore[method-assign]


FAMILY.declare(
    FaultDeclaration(
        number=3,
        name="touch-leaves-free-block-queued",
        description=(
            "touch raises a free hit block's ref_cnt but leaves it in the free queue, so it can be handed out again"
        ),
        kvcore=plant_touch_leaves_free_block_queued,
    )
)


def plant_free_table_head_first(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def free_table(table: Sequence[KVBlock]) -> None:
        # The bug: the table is passed in position order, so a request's
        # head block (the shared prefix) is reused or evicted first.
        pool.free_blocks(table)

    pool.free_table = free_table  # type: ignore[method-assign]


FAMILY.declare(
    FaultDeclaration(
        number=4,
        name="free-table-head-first",
        description=(
            "free_table frees a request's blocks in position order: its head (shared prefix) is evicted first"
        ),
        kvcore=plant_free_table_head_first,
    )
)


def plant_reset_discounts_null_block_twice(manager: kvcore.KVCacheManager) -> None:
    pool = manager.block_pool

    def reset_prefix_cache() -> bool:
        num_used_blocks = pool.num_blocks - 1 - pool.free_queue.num_free
        # The bug: "the null block is always in use" is allowed for here, but
        # it was already left out above; one held block slips through and the
        # cache is emptied under it.
        if num_used_blocks > 1:
            return False
        pool.cache.clear()
        for block in pool.blocks:
            block.block_hash = None
        pool.record_event(AllBlocksCleared())
        return True

    pool.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]


FAMILY.declare(
    FaultDeclaration(
        number=5,
        name="reset-discounts-null-block-twice",
        description=("reset_prefix_cache discounts the null block twice and empties the cache under one held block"),
        kvcore=plant_reset_discounts_null_block_twice,
    )
)


def popped_in_eviction_order(pop_blocks_for_free: Any) -> Any:
    """``pop_blocks_for_free`` returning the blocks tail first, as ``free`` passes them to the pool;
    the scheduler reverses the list again, so a deferred free evicts the shared prefix first."""

    def pop_tail_first(request_id: str) -> list[Any]:
        blocks: list[Any] = pop_blocks_for_free(request_id)
        # The bug: the popped list is documented in allocation order, but is
        # returned in the order free() releases blocks (the tail first).
        return blocks[::-1]

    return pop_tail_first


def plant_deferred_free_in_eviction_order(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    coordinator.pop_blocks_for_free = popped_in_eviction_order(coordinator.pop_blocks_for_free)  # type: ignore[method-assign]


def plant_deferred_free_in_eviction_order_in_vllm(manager: Any) -> None:
    coordinator = manager.coordinator
    coordinator.pop_blocks_for_free = popped_in_eviction_order(coordinator.pop_blocks_for_free)


FAMILY.declare(
    FaultDeclaration(
        number=17,
        name="deferred-free-in-eviction-order",
        description=(
            "pop_blocks_for_free returns the blocks tail first, as free passes them; the deferred "
            "free reverses them again and evicts the shared prefix first"
        ),
        kvcore=plant_deferred_free_in_eviction_order,
        vllm=VllmPlant(
            number=9,
            description="vLLM pop_blocks_for_free returning the blocks tail first",
            plant=plant_deferred_free_in_eviction_order_in_vllm,
        ),
    )
)
