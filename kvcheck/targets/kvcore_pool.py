"""The kvcore block-pool target: a :class:`kvcore.BlockPool` driven by block ids and small-int keys."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import kvcore

PoolEntry = tuple[int, int, int]
"""A prefix-cache entry as (group id, key token, block id)."""


class KvcorePool:
    """A block pool whose blocks are named by id and whose cache keys are small ints.

    A key stands for a token prefix; here it becomes an opaque 32-byte hash,
    and the pool's entries are translated back to keys when observed.
    ``pool_factory`` builds the pool; a planted bug replaces it with a
    subclass.
    """

    name = "kvcore"
    moves_cached_blocks = True

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool,
        pool_factory: Callable[[int, bool], kvcore.BlockPool] = kvcore.BlockPool,
    ) -> None:
        self.pool = pool_factory(num_blocks, enable_caching)
        self._key_of_hash: dict[bytes, int] = {}

    def _hash(self, key: int) -> bytes:
        block_hash = hashlib.sha256(b"kvcheck/pool-key/%d" % key).digest()
        self._key_of_hash[block_hash] = key
        return block_hash

    def _blocks(self, block_ids: Sequence[int]) -> list[kvcore.KVBlock]:
        return [self.pool.blocks[block_id] for block_id in block_ids]

    # -- operations -----------------------------------------------------------

    def get_new_blocks(self, n_blocks: int) -> list[int] | None:
        """Allocate ``n_blocks`` from the head; ``None`` if the pool refused (fewer free)."""
        try:
            blocks = self.pool.get_new_blocks(n_blocks)
        except kvcore.OutOfBlocks:
            return None
        return [block.block_id for block in blocks]

    def touch(self, block_ids: Sequence[int]) -> None:
        self.pool.touch(self._blocks(block_ids))

    def free(self, block_ids_in_eviction_order: Sequence[int]) -> None:
        self.pool.free_blocks(self._blocks(block_ids_in_eviction_order))

    def cache(self, block_ids: Sequence[int], keys: Sequence[int], group_id: int) -> None:
        self.pool.cache_blocks(self._blocks(block_ids), [self._hash(key) for key in keys], group_id)

    def lookup(self, key: int, group_id: int) -> int | None:
        """The block a prefix hit on ``key`` in ``group_id`` returns, or ``None``."""
        found = self.pool.get_cached_block(self._hash(key), [group_id])
        return None if found is None else found[0].block_id

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
