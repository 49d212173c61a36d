"""The kvcore block-pool target: a :class:`kvcore.BlockPool` driven by block ids and small-int keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import kvcore
from kvcheck.targets.id_named_pool import IdNamedPool, PoolEntry


class KvcorePool(IdNamedPool):
    """kvcore's block pool, whose blocks are named by id and whose cache keys are small ints.

    ``pool_factory`` builds the pool; a planted bug replaces it with a
    subclass.
    """

    name = "kvcore"
    moves_cached_blocks = True
    refusal = kvcore.OutOfBlocks
    pool: kvcore.BlockPool

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool,
        pool_factory: Callable[[int, bool], kvcore.BlockPool] = kvcore.BlockPool,
    ) -> None:
        super().__init__(pool_factory(num_blocks, enable_caching))

    # -- operations -----------------------------------------------------------

    def cache(self, block_ids: Sequence[int], keys: Sequence[int], group_id: int) -> None:
        self.pool.cache_blocks(self._blocks(block_ids), [self._hash(key) for key in keys], group_id)

    def evict(self, block_ids: Sequence[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- observation ----------------------------------------------------------

    def free_order(self) -> list[int]:
        """The free queue walked head (next to allocate) to tail."""
        return self.pool.free_block_ids()

    def free_order_from_tail(self) -> list[int]:
        return self.pool.free_queue.block_ids_from_tail()

    @property
    def num_free(self) -> int:
        return self.pool.num_free_blocks

    def ref_counts(self) -> dict[int, int]:
        """``ref_cnt`` of every block but the null block."""
        return self.pool.ref_counts()

    def cache_entries(self) -> frozenset[PoolEntry]:
        return frozenset(
            (group_id, self._key_of_hash[block_hash], block_id)
            for (block_hash, group_id), block_id in self.pool.cache_entries()
        )

    def check_internal(self) -> None:
        self.pool.check_invariants()
