"""The prefix-cache map: block hash (with group id) to cached blocks."""

from __future__ import annotations

from collections.abc import Iterator

from kvcore.block import KVBlock
from kvcore.hashing import BlockHashWithGroup


class PrefixCacheMap:
    """Maps a block hash with its group id to the blocks cached under it.

    Blocks are not de-duplicated: two blocks with the same contents may both
    be cached under one key.  A lookup returns the earliest one inserted that
    is still cached, and removing one leaves the others findable.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[BlockHashWithGroup, dict[int, KVBlock]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get_one(self, key: BlockHashWithGroup) -> KVBlock | None:
        """A block cached under ``key``, or ``None``."""
        blocks = self._entries.get(key)
        if blocks is None:
            return None
        return next(iter(blocks.values()))

    def insert(self, key: BlockHashWithGroup, block: KVBlock) -> None:
        """Enter ``block`` under ``key``."""
        self._entries.setdefault(key, {})[block.block_id] = block

    def pop(self, key: BlockHashWithGroup, block_id: int) -> KVBlock | None:
        """Remove block ``block_id`` from ``key``; returns it, or ``None`` if absent."""
        blocks = self._entries.get(key)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._entries[key]
        return block

    def clear(self) -> None:
        self._entries.clear()

    def items(self) -> Iterator[tuple[BlockHashWithGroup, KVBlock]]:
        """Every (key, block) entry, keys in insertion order."""
        for key, blocks in self._entries.items():
            for block in blocks.values():
                yield key, block

    def check_invariants(self) -> None:
        """Every entry points to the block it is filed under; no key is empty.  (That the key is one of
        the block's own is the pool's to check: a block may have a partial key besides its hash.)"""
        for key, blocks in self._entries.items():
            assert blocks, f"key {key!r} has no blocks"
            for block_id, block in blocks.items():
                assert block.block_id == block_id, f"entry {block_id} holds block {block.block_id}"
