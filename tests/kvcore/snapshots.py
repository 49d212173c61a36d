"""Observations of a block pool or KV-cache manager, taken to compare state before and after an operation."""

from __future__ import annotations

import attrs

from kvcore import BlockPool, KVCacheManager

Slot = tuple[str, int, int]
"""A table slot: (request id, group id, block index in the table)."""


@attrs.frozen
class PoolSnapshot:
    """Everything a block pool shows: free order, ref counts, cache entries and block hashes."""

    free_order: tuple[int, ...]
    ref_counts: tuple[tuple[int, int], ...]
    cache_entries: tuple[tuple[tuple[bytes, int], int], ...]
    block_hashes: tuple[tuple[int, tuple[bytes, int] | None], ...]


@attrs.frozen
class ManagerSnapshot:
    """A pool snapshot plus every request's table and cached-block count per group."""

    pool: PoolSnapshot
    tables: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]
    num_cached_blocks: tuple[tuple[tuple[str, int], ...], ...]


def snapshot_pool(pool: BlockPool) -> PoolSnapshot:
    """The observable state of ``pool``."""
    return PoolSnapshot(
        free_order=tuple(pool.free_block_ids()),
        ref_counts=tuple(sorted(pool.ref_counts().items())),
        cache_entries=tuple(sorted(pool.cache_entries())),
        block_hashes=tuple((block.block_id, block.block_hash) for block in pool.blocks),
    )


def snapshot(manager: KVCacheManager) -> ManagerSnapshot:
    """The observable state of ``manager``, its pool included."""
    return ManagerSnapshot(
        pool=snapshot_pool(manager.block_pool),
        tables=tuple(
            (request_id, tuple(tuple(ids) for ids in manager.get_block_ids(request_id)))
            for request_id in sorted(manager.request_ids())
        ),
        num_cached_blocks=tuple(
            tuple(sorted(group.num_cached_blocks.items())) for group in manager.coordinator.managers
        ),
    )


def table_slots(manager: KVCacheManager) -> dict[int, list[Slot]]:
    """Every table slot holding each block id, the null block aside."""
    slots: dict[int, list[Slot]] = {}
    for request_id in manager.request_ids():
        for group_id, ids in enumerate(manager.get_block_ids(request_id)):
            for index, block_id in enumerate(ids):
                if block_id != 0:
                    slots.setdefault(block_id, []).append((request_id, group_id, index))
    return slots


def holder_counts(manager: KVCacheManager) -> dict[int, int]:
    """How many table slots hold each block, for every block but the null block."""
    slots = table_slots(manager)
    return {block_id: len(slots.get(block_id, [])) for block_id in range(1, manager.block_pool.num_blocks)}
