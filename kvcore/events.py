"""KV cache events: what the prefix cache tells the outside world about its entries.

External caches and routers rebuild their view of which prefixes a cache
holds from this stream alone, so it must say exactly what changed: a
:class:`BlockStored` for every batch of blocks entered under their hashes, a
:class:`BlockRemoved` for every entry dropped (eviction on reuse, or an
explicit eviction), and :class:`AllBlocksCleared` when the whole cache is
reset.  Field names are those of vLLM's wire events.
"""

from __future__ import annotations

import attrs

from kvcore.hashing import BlockHash


@attrs.frozen
class BlockStored:
    """Blocks of one group entered in the prefix cache by one caching call.

    ``block_hashes`` are the hashes of the blocks entered (null blocks are
    never entered, so they are left out); ``parent_block_hash`` is the hash
    of the block before the first one the call covers (``None`` at the start
    of a request); ``token_ids`` are the tokens of every block position the
    call covers, ``block_size`` each; ``lookahead_token_ids`` are, per
    entered block, the tokens after it that its hash also covers (``None``
    without lookahead hashing).
    """

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    group_idx: int
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None


@attrs.frozen
class BlockRemoved:
    """Entries of one group dropped from the prefix cache."""

    block_hashes: tuple[BlockHash, ...]
    group_idx: int


@attrs.frozen
class AllBlocksCleared:
    """The whole prefix cache was emptied."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
