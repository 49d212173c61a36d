"""The block pool: hands out blocks, takes them back, and keeps the prefix cache."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvcore.block import NULL_BLOCK_ID, KVBlock
from kvcore.errors import InvalidArgument, OutOfBlocks, RefCountUnderflow, UnknownBlock
from kvcore.events import AllBlocksCleared, BlockRemoved, KVCacheEvent
from kvcore.free_queue import FreeBlockQueue
from kvcore.hashing import BlockHash, BlockHashWithGroup
from kvcore.prefix_map import PrefixCacheMap


class BlockPool:
    """All the blocks of one KV cache, the free queue and the prefix cache.

    Block 0 is taken out at start as the null block.  Every other block is at
    any moment either held (``ref_cnt > 0``) or in the free queue
    (``ref_cnt == 0``), never both.

    Eviction order, the contract of the free queue:

    1. Allocation takes blocks from the head of the queue.
    2. A freed block that has no hash, or any freed block while caching is
       off, goes to the head: the most recently freed block is reused first
       (LIFO), which keeps the working set of block ids small.
    3. A freed block that is cached goes to the tail: cached blocks are
       evicted least recently freed first (LRU), so a popular prefix survives.
    4. Allocating a cached block evicts it: its hash leaves the map.
    5. Touching a free cached block (a prefix hit) takes it out of the queue.

    With ``enable_kv_cache_events`` every cache entry dropped queues a
    :class:`~kvcore.events.BlockRemoved` and a reset an
    :class:`~kvcore.events.AllBlocksCleared`; the managers queue the
    :class:`~kvcore.events.BlockStored` events (they know the tokens).
    :meth:`take_events` hands the queue over.

    A block is cached under one key (its ``block_hash``) and, when a prompt's
    last hash boundary falls inside it, under that boundary's *partial* key
    too (:meth:`cache_partial_block`); evicting the block drops every key,
    its own first.
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool,
        enable_kv_cache_events: bool = False,
        hash_block_size: int | None = None,
    ) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise InvalidArgument("num_blocks", num_blocks, "must be an int >= 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(block_id) for block_id in range(num_blocks)]
        self.null_block = self.blocks[NULL_BLOCK_ID]
        self.null_block.is_null = True
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cache = PrefixCacheMap()
        self.hash_block_size = hash_block_size
        """The tokens per request block hash (``None``: every group's block size)."""
        self._more_keys: dict[int, list[BlockHashWithGroup]] = {}
        """Block id -> the keys it is cached under besides its ``block_hash``, in the order entered."""
        self._partial_tokens: dict[int, int] = {}
        """Block id -> the tokens its ``block_hash`` covers, where that is a partial key."""
        self.enable_kv_cache_events = enable_kv_cache_events
        self._events: list[KVCacheEvent] = []

    # -- counts ---------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    @property
    def usage(self) -> float:
        """The fraction of usable blocks (the null block aside) that are held."""
        return 1.0 - self.free_queue.num_free / (self.num_blocks - 1)

    # -- allocation -----------------------------------------------------------

    def get_new_blocks(self, n_blocks: int) -> list[KVBlock]:
        """Take ``n_blocks`` blocks from the head of the free queue.

        Cached blocks among them are evicted.  Each returned block has
        ``ref_cnt == 1``.  Raises :class:`OutOfBlocks` (and takes nothing) when
        fewer blocks are free.
        """
        if n_blocks < 0:
            raise InvalidArgument("n_blocks", n_blocks, "must be >= 0")
        if n_blocks > self.free_queue.num_free:
            raise OutOfBlocks(requested=n_blocks, available=self.free_queue.num_free)
        blocks = self.free_queue.popleft_n(n_blocks)
        for block in blocks:
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take one more reference on each block (a prefix hit).

        A block with ``ref_cnt == 0`` leaves the free queue.  The null block is
        skipped.
        """
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: Iterable[KVBlock], evict_first: bool = False) -> None:
        """Drop one reference on each block; blocks left unreferenced become free.

        The blocks come in eviction order: the first is the one to reuse or
        evict first.  Blocks reaching ``ref_cnt == 0`` are placed by the
        eviction-order contract of this class: unhashed ones (all of them
        while caching is off) at the head, keeping their order; cached ones
        at the tail, keeping their order, unless ``evict_first`` (their
        contents are held elsewhere, by another tier): then at the head
        too, to be evicted before every other cached block.  The null block
        is skipped.

        Raises :class:`RefCountUnderflow`, changing nothing, if a block would
        drop below zero.
        """
        released_to_head: list[KVBlock] = []
        released_to_tail: list[KVBlock] = []
        dropped: list[KVBlock] = []
        for block in blocks_in_eviction_order:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                for done in dropped:
                    done.ref_cnt += 1
                raise RefCountUnderflow(block_id=block.block_id)
            block.ref_cnt -= 1
            dropped.append(block)
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching or evict_first:
                    released_to_head.append(block)
                else:
                    released_to_tail.append(block)
        self.free_queue.prepend_n(released_to_head)
        self.free_queue.append_n(released_to_tail)

    def free_table(self, table: Sequence[KVBlock]) -> None:
        """Free a request's table (blocks in position order), tail block first.

        The tail of a request is the part least likely to be shared, so it is
        the first to be reused or evicted.
        """
        self.free_blocks(reversed(table))

    # -- prefix cache ---------------------------------------------------------

    def get_cached_block(self, block_hash: BlockHash, group_ids: Sequence[int]) -> list[KVBlock] | None:
        """The block cached under ``block_hash`` for each group, or ``None`` if any group misses."""
        found = []
        for group_id in group_ids:
            block = self.cache.get_one((block_hash, group_id))
            if block is None:
                return None
            found.append(block)
        return found

    def cache_blocks(self, blocks: Sequence[KVBlock], hashes: Sequence[BlockHash], group_id: int) -> None:
        """Enter full ``blocks`` in the prefix cache under ``hashes`` for ``group_id``.

        Null blocks are skipped; a block already cached under its key is left
        as it is, and one cached under other keys (a partial entry, now that the
        block is full) loses them for the new key.
        """
        for block, block_hash in zip(blocks, hashes, strict=True):
            if block.is_null:
                continue
            key = (block_hash, group_id)
            if block.block_hash == key:
                continue
            if block.block_hash is not None:
                self._evict(block)
            block.block_hash = key
            self.cache.insert(key, block)

    def cache_partial_block(
        self, block: KVBlock, key: BlockHashWithGroup, num_tokens: int, replace: bool = False
    ) -> bool:
        """Enter ``block`` under the partial key of the hash boundary after ``num_tokens`` tokens, inside the
        block, beside any key it has; or in place of every key it has, if its own is a partial key of a
        shorter boundary (the prompt's boundary moved on as more of it was hashed), or with ``replace``
        (the block now holds another state): those are evicted.

        Returns whether the entry is new (``False`` for the null block or,
        without ``replace``, a key the block is already cached under).
        """
        if block.is_null:
            return False
        if replace and block.block_hash is not None:
            self._evict(block)
        if block.block_hash == key or key in self._more_keys.get(block.block_id, ()):
            return False
        if block.block_hash is not None and self._partial_tokens.get(block.block_id, num_tokens) < num_tokens:
            self._evict(block)
        if block.block_hash is None:
            block.block_hash = key
            self._partial_tokens[block.block_id] = num_tokens
        else:
            self._more_keys.setdefault(block.block_id, []).append(key)
        self.cache.insert(key, block)
        return True

    def move_block_hashes(self, source: KVBlock, destination: KVBlock) -> None:
        """Enter ``destination`` under every key ``source`` is cached under, in its place.

        For a block its request goes on writing: the prefix cache keeps a
        copy (``destination``, filled by a block copy before the write)
        under the same keys.  The entries stay live, so no event is queued.
        """
        assert destination.block_hash is None, f"block {destination.block_id} is cached already"
        keys = self.block_keys(source)
        if not keys:
            return
        num_tokens = self._partial_tokens.pop(source.block_id, None)
        self._more_keys.pop(source.block_id, None)
        source.block_hash = None
        for key in keys:
            self.cache.pop(key, source.block_id)
        destination.block_hash = keys[0]
        if num_tokens is not None:
            self._partial_tokens[destination.block_id] = num_tokens
        if len(keys) > 1:
            self._more_keys[destination.block_id] = keys[1:]
        for key in keys:
            self.cache.insert(key, destination)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cache entries of the given blocks.

        Blocks still held stay allocated but can no longer be hit; free ones
        stay in the queue where they are.  Raises :class:`UnknownBlock`,
        changing nothing, if any id names no block.
        """
        ids = list(block_ids)
        for block_id in ids:
            if not isinstance(block_id, int) or isinstance(block_id, bool) or not 0 <= block_id < self.num_blocks:
                raise UnknownBlock(block_id=block_id, num_blocks=self.num_blocks)
        for block_id in ids:
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self._evict(block)

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache; refused (returns ``False``) while any block is held."""
        if self.free_queue.num_free != self.num_blocks - 1:
            return False
        self.cache.clear()
        self._more_keys.clear()
        self._partial_tokens.clear()
        for block in self.blocks:
            block.block_hash = None
        self.record_event(AllBlocksCleared())
        return True

    def _evict(self, block: KVBlock) -> None:
        """Drop every key of the block: its ``block_hash`` first, then the others in the order entered."""
        assert block.block_hash is not None
        keys = [block.block_hash, *self._more_keys.pop(block.block_id, ())]
        block.block_hash = None
        self._partial_tokens.pop(block.block_id, None)
        for key in keys:
            self.cache.pop(key, block.block_id)
            block_hash, group_id = key
            self.record_event(BlockRemoved((block_hash,), group_id))

    # -- KV cache events ------------------------------------------------------

    def record_event(self, event: KVCacheEvent) -> None:
        """Queue ``event`` if events are enabled."""
        if self.enable_kv_cache_events:
            self._events.append(event)

    def take_events(self) -> list[KVCacheEvent]:
        """The events queued since the last call, oldest first; the queue is left empty."""
        events, self._events = self._events, []
        return events

    # -- introspection --------------------------------------------------------

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to allocate) first."""
        return self.free_queue.block_ids()

    def ref_counts(self) -> dict[int, int]:
        """``ref_cnt`` of every block but the null block."""
        return {block.block_id: block.ref_cnt for block in self.blocks[1:]}

    def block_keys(self, block: KVBlock) -> list[BlockHashWithGroup]:
        """The keys the block records being cached under: its ``block_hash``, then any partial keys."""
        if block.block_hash is None:
            return []
        return [block.block_hash, *self._more_keys.get(block.block_id, ())]

    def hash_tokens(self, block: KVBlock, full_block_tokens: int) -> int | None:
        """The tokens the block's own key covers: a partial key's boundary, else ``full_block_tokens``
        (the end of the position the caller holds it at); ``None`` for a block not cached."""
        if block.block_hash is None:
            return None
        return self._partial_tokens.get(block.block_id, full_block_tokens)

    def cache_entries(self) -> list[tuple[BlockHashWithGroup, int]]:
        """Every prefix-cache entry as (key, block id)."""
        return [(key, block.block_id) for key, block in self.cache.items()]

    def check_invariants(self) -> None:
        """Assert the pool's structural invariants (an expensive no-op when correct)."""
        self.free_queue.check_invariants()
        self.cache.check_invariants()
        null = self.null_block
        assert null.ref_cnt == 0, f"null block ref_cnt={null.ref_cnt}"
        assert null.block_hash is None, "null block is cached"
        assert null.prev_free is None and null.next_free is None, "null block is in the free queue"
        in_queue = {block.block_id for block in self.free_queue}
        entries = {(key, block.block_id) for key, block in self.cache.items()}
        for block in self.blocks[1:]:
            assert block.ref_cnt >= 0, f"block {block.block_id} ref_cnt={block.ref_cnt}"
            queued = block.block_id in in_queue
            assert queued == (block.ref_cnt == 0), (
                f"block {block.block_id}: ref_cnt={block.ref_cnt} but in_free_queue={queued}"
            )
            if block.block_hash is not None:
                assert (block.block_hash, block.block_id) in entries, (
                    f"block {block.block_id} has a hash but is not entered under it"
                )
            for key in self._more_keys.get(block.block_id, ()):
                assert block.block_hash is not None, f"block {block.block_id} has partial keys but no hash"
                assert (key, block.block_id) in entries, f"block {block.block_id} is not entered under a key it has"
        for key, block in self.cache.items():
            assert key == block.block_hash or key in self._more_keys.get(block.block_id, ()), (
                f"block {block.block_id} is entered under a key it does not have"
            )
        num_keys = sum(block.block_hash is not None for block in self.blocks) + sum(map(len, self._more_keys.values()))
        assert num_keys == len(entries), f"{len(entries)} cache entries but blocks have {num_keys} keys"
