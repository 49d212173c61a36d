"""What the block-pool targets share: blocks named by id, cache keys named by small ints."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

PoolEntry = tuple[int, int, int]
"""A prefix-cache entry as (group id, key token, block id)."""


class IdNamedPool:
    """A block pool (kvcore's or vLLM's: ``blocks``, ``get_new_blocks``, ``touch``, ``free_blocks``)
    seen through block ids and small-int keys.

    A key stands for a token prefix; it becomes an opaque 32-byte hash, and
    the pool's entries are translated back to keys when observed.
    ``refusal`` is the exception the pool raises, changing nothing, when it
    cannot allocate.
    """

    refusal: ClassVar[type[Exception]]

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._key_of_hash: dict[bytes, int] = {}

    def _hash(self, key: int) -> bytes:
        block_hash = hashlib.sha256(b"kvcheck/pool-key/%d" % key).digest()
        self._key_of_hash[block_hash] = key
        return block_hash

    def _blocks(self, block_ids: Sequence[int]) -> list[Any]:
        return [self.pool.blocks[block_id] for block_id in block_ids]

    def get_new_blocks(self, n_blocks: int) -> list[int] | None:
        """Allocate ``n_blocks`` from the head; ``None`` if the pool refused (fewer free)."""
        try:
            blocks = self.pool.get_new_blocks(n_blocks)
        except self.refusal:
            return None
        return [block.block_id for block in blocks]

    def touch(self, block_ids: Sequence[int]) -> None:
        self.pool.touch(self._blocks(block_ids))

    def free(self, block_ids_in_eviction_order: Sequence[int]) -> None:
        self.pool.free_blocks(self._blocks(block_ids_in_eviction_order))

    def lookup(self, key: int, group_id: int) -> int | None:
        """The block a prefix hit on ``key`` in ``group_id`` returns, or ``None``."""
        found = self.pool.get_cached_block(self._hash(key), [group_id])
        return None if found is None else int(found[0].block_id)
