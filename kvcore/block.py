"""The KV-cache block: the unit the pool hands out."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcore.hashing import BlockHashWithGroup

NULL_BLOCK_ID = 0


class KVBlock:
    """One physical KV-cache block.

    ``ref_cnt`` counts the table slots (over all requests and groups) that hold
    the block.  ``block_hash`` is set while the block is entered in the prefix
    cache.  ``prev_free``/``next_free`` are owned by :class:`FreeBlockQueue`
    and are ``None`` whenever the block is not in the queue.

    Block 0 is the *null block*: it stands in for positions a request no
    longer needs (outside a sliding window, before a local-attention chunk),
    is never in the free queue, never cached, and its ``ref_cnt`` stays 0.
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHashWithGroup | None = None
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        cached = "" if self.block_hash is None else f", cached(group={self.block_hash[1]})"
        return f"KVBlock({self.block_id}, ref_cnt={self.ref_cnt}{cached})"
