"""What the invariants see of a target: block ids and token prefixes, never allocator objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

CacheKey = tuple[int, tuple[int, ...]]
"""A prefix-cache key as (group id, token ids of the whole prefix ending with the block)."""

Prefix = tuple[int, ...]
"""The token ids a block hash stands for: the whole prefix ending with the block (and its lookahead)."""


@attrs.frozen
class StoredEvent:
    """A ``BlockStored`` KV cache event, hashes read as the token prefixes they stand for.

    ``prefixes`` are the entries stored, ``parent`` the prefix of the block
    before the first position the event covers (``None`` at a request's
    start), ``token_ids`` the tokens of every position it covers.
    """

    group: int
    prefixes: tuple[Prefix, ...]
    parent: Prefix | None
    token_ids: tuple[int, ...]
    block_size: int
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None


@attrs.frozen
class RemovedEvent:
    """One entry of a ``BlockRemoved`` KV cache event."""

    group: int
    prefix: Prefix


@attrs.frozen
class ClearedEvent:
    """An ``AllBlocksCleared`` KV cache event."""


CacheEvent = StoredEvent | RemovedEvent | ClearedEvent


def block_keys(keys: Iterable[tuple[CacheKey, int]]) -> dict[int, tuple[CacheKey, ...]]:
    """Each block's keys from (key, block id) pairs: the first given for a block first (its own hash),
    the rest sorted (an allocator may keep them unordered)."""
    by_block: dict[int, list[CacheKey]] = {}
    for key, block_id in keys:
        by_block.setdefault(block_id, []).append(key)
    return {block_id: (found[0], *sorted(found[1:])) for block_id, found in by_block.items()}


@attrs.frozen
class Observation:
    """A snapshot of a target after a step.

    ``free_order`` walks the free queue head to tail by its forward links,
    ``free_order_backward`` tail to head by its backward links.
    ``cache_entries`` lists the prefix-cache map's entries as
    (group, prefix, block id); ``block_cache_keys`` the keys each cached block
    itself records (its hash, then any partial keys, sorted).  ``tables``
    maps each request holding blocks to its table per
    group (0 is the null block).  ``deferred_frees`` lists the blocks each
    pending deferred free holds (async scheduling with deferred frees), in
    the order the allocator popped them; ``in_flight_reads`` the block ids
    each step in flight reads and writes, per group, for the steps whose
    blocks must still be held.  ``events`` is the KV cache event stream
    taken after every step since the target was built (empty unless the
    configuration enables events).  ``prompt_lengths`` maps each request the
    target knows to its prompt's length in tokens; ``draft_tokens`` each
    request that ran a speculative decode step to the most draft tokens
    one of its steps scheduled; ``state_tokens`` each request that ran a
    step since it was admitted to the tokens its last step ran up to,
    drafts included (an align-mode Mamba group's state is saved in the
    block of that step's last token).
    """

    free_order: tuple[int, ...]
    free_order_backward: tuple[int, ...]
    num_free: int
    ref_counts: Mapping[int, int]
    tables: Mapping[str, tuple[tuple[int, ...], ...]]
    cache_entries: frozenset[tuple[int, tuple[int, ...], int]]
    block_cache_keys: Mapping[int, tuple[CacheKey, ...]]
    deferred_frees: tuple[tuple[int, ...], ...] = ()
    in_flight_reads: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()
    events: tuple[CacheEvent, ...] = ()
    prompt_lengths: Mapping[str, int] = attrs.field(factory=dict)
    draft_tokens: Mapping[str, int] = attrs.field(factory=dict)
    state_tokens: Mapping[str, int] = attrs.field(factory=dict)
