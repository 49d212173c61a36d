"""What the invariants see of a target: block ids and token prefixes, never allocator objects."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

CacheKey = tuple[int, tuple[int, ...]]
"""A prefix-cache key as (group id, token ids of the whole prefix ending with the block)."""


@attrs.frozen
class Observation:
    """A snapshot of a target after a step.

    ``free_order`` walks the free queue head to tail by its forward links,
    ``free_order_backward`` tail to head by its backward links.
    ``cache_entries`` lists the prefix-cache map's entries as
    (group, prefix, block id); ``block_cache_keys`` the key each block itself
    records.  ``tables`` maps each request holding blocks to its table per
    group (0 is the null block).  ``deferred_frees`` lists the blocks each
    pending deferred free holds (async scheduling with deferred frees), in
    the order the allocator popped them; ``in_flight_reads`` the block ids
    each step in flight reads and writes, per group, for the steps whose
    blocks must still be held.
    """

    free_order: tuple[int, ...]
    free_order_backward: tuple[int, ...]
    num_free: int
    ref_counts: Mapping[int, int]
    tables: Mapping[str, tuple[tuple[int, ...], ...]]
    cache_entries: frozenset[tuple[int, tuple[int, ...], int]]
    block_cache_keys: Mapping[int, CacheKey]
    deferred_frees: tuple[tuple[int, ...], ...] = ()
    in_flight_reads: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()
