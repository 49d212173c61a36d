"""The block pool, as lists and dicts."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from kvmodel.observation import CacheEvent, ClearedEvent, RemovedEvent

NULL = 0
CacheKey = tuple[int, tuple[int, ...]]
"""(group id, token ids of the whole prefix that ends with the block)."""


class PoolModel:
    """What the block pool must do, stated as simply as possible.

    - ``free_order``: the free blocks, head (next handed out) first.
    - ``holders``: each holder (a request's table in one group, say) and the
      block ids it holds; 0, the null block, holds nothing.
    - ``cache``: cached block id -> its own key, in the order blocks were cached.
    - ``more_keys``: cached block id -> the partial keys it has besides (a
      prompt's last hash boundary inside it), in the order entered.
    - ``key_blocks``: each key -> the blocks entered under it, in the order
      entered; a lookup returns the first.

    A block's reference count is not stored: it is the number of holder
    slots that name it.

    ``events`` (when not ``None``) receives a removal for every cache entry
    dropped and a clear for every reset, in the order they happen.
    """

    def __init__(self, num_blocks: int, enable_caching: bool, events: list[CacheEvent] | None = None) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.free_order: list[int] = list(range(1, num_blocks))
        self.holders: dict[Hashable, list[int]] = {}
        self.cache: dict[int, CacheKey] = {}
        self.more_keys: dict[int, list[CacheKey]] = {}
        self.key_blocks: dict[CacheKey, list[int]] = {}
        self.events = events

    def ref_counts(self) -> dict[int, int]:
        counts = dict.fromkeys(range(1, self.num_blocks), 0)
        for blocks in self.holders.values():
            for block_id in blocks:
                if block_id != NULL:
                    counts[block_id] += 1
        return counts

    def entries(self) -> list[tuple[CacheKey, int]]:
        """Every cache entry as (key, block id): own keys in the order cached, then partial keys."""
        own = [(key, block_id) for block_id, key in self.cache.items()]
        return own + [(key, block_id) for block_id, keys in self.more_keys.items() for key in keys]

    def lookup(self, key: CacheKey) -> int | None:
        """The block a hit on ``key`` returns: the earliest entered under it that still is."""
        blocks = self.key_blocks.get(key)
        return blocks[0] if blocks else None

    def take_free(self, n_blocks: int) -> list[int]:
        """Hand out the first ``n_blocks`` free blocks; a cached one loses its cache entry."""
        taken, self.free_order = self.free_order[:n_blocks], self.free_order[n_blocks:]
        assert len(taken) == n_blocks, f"model: {n_blocks} blocks asked, {len(taken)} free"
        for block_id in taken:
            self._uncache(block_id)
        return taken

    def touch(self, block_ids: Iterable[int]) -> None:
        """A hit on free blocks takes them out of the free order."""
        for block_id in block_ids:
            if block_id in self.free_order:
                self.free_order.remove(block_id)

    def release(self, block_ids_in_eviction_order: Iterable[int]) -> None:
        """Blocks whose last holder let go (holder slots already removed) rejoin the free order.

        Uncached blocks, or all blocks while caching is off, go to the head in
        the given order; cached blocks go to the tail in the given order.
        """
        counts = self.ref_counts()
        to_head: list[int] = []
        to_tail: list[int] = []
        seen = set(self.free_order)
        for block_id in block_ids_in_eviction_order:
            if block_id == NULL or counts[block_id] > 0 or block_id in seen:
                continue
            seen.add(block_id)
            if block_id in self.cache and self.enable_caching:
                to_tail.append(block_id)
            else:
                to_head.append(block_id)
        self.free_order = to_head + self.free_order + to_tail

    def cache_block(self, block_id: int, key: CacheKey) -> None:
        if block_id == NULL or self.cache.get(block_id) == key:
            return
        self._uncache(block_id)
        self.cache[block_id] = key
        self.key_blocks.setdefault(key, []).append(block_id)

    def add_key(self, block_id: int, key: CacheKey) -> bool:
        """Enter the block under a partial key too (its own key, if it has none); whether it is new.  A
        block whose own key is a shorter prefix (a partial key of an earlier boundary inside it) loses
        every key it has first."""
        if block_id == NULL or self.cache.get(block_id) == key or key in self.more_keys.get(block_id, ()):
            return False
        own = self.cache.get(block_id)
        if own is not None and len(own[1]) < len(key[1]):
            self._uncache(block_id)
        if block_id in self.cache:
            self.more_keys.setdefault(block_id, []).append(key)
        else:
            self.cache[block_id] = key
        self.key_blocks.setdefault(key, []).append(block_id)
        return True

    def move_keys(self, source: int, destination: int) -> None:
        """Enter ``destination`` (cached under no key) under every key ``source`` has, in its place: the
        cache keeps a copy of a block its request goes on writing.  No event: the entries stay."""
        key = self.cache.pop(source, None)
        if key is None:
            return
        keys = [key, *self.more_keys.pop(source, ())]
        for moved in keys:
            blocks = self.key_blocks[moved]
            blocks.remove(source)
            blocks.append(destination)
        self.cache[destination] = key
        if len(keys) > 1:
            self.more_keys[destination] = keys[1:]

    def evict(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            self._uncache(block_id)

    def reset_prefix_cache(self) -> bool:
        if len(self.free_order) != self.num_blocks - 1:
            return False
        self.cache.clear()
        self.more_keys.clear()
        self.key_blocks.clear()
        if self.events is not None:
            self.events.append(ClearedEvent())
        return True

    def _uncache(self, block_id: int) -> None:
        """Drop every key of the block, its own first."""
        key = self.cache.pop(block_id, None)
        if key is None:
            return
        keys = [key, *self.more_keys.pop(block_id, ())]
        for dropped in keys:
            blocks = self.key_blocks[dropped]
            blocks.remove(block_id)
            if not blocks:
                del self.key_blocks[dropped]
        if self.events is not None:
            self.events.extend(RemovedEvent(*k) for k in keys)
