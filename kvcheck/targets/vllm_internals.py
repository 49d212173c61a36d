"""Every read of vLLM's allocator below ``KVCacheManager``'s public methods, for each known release.

The targets, the fault plants and the exported tests see vLLM's private
structures (the prefix-cache map, block fields, the free queue's links,
per-group tables, pool helpers) only through this module.  Where releases
lay a structure out differently, the reader for each layout is a plain
function of its own, keyed by the first release that uses it, so that
:mod:`kvcheck.export` can inline the one for the exported release.  A
release that moves an internal breaks here, and :class:`VllmInternalsChanged`
names the release and the attribute.

Layouts by release (see ``kvcheck/vllm_releases.py`` for the behaviours):

- the prefix-cache map ``BlockPool.cached_block_hash_to_block``: in 0.33.0
  ``_cache`` maps a key to one block or to a dict of blocks by id; from
  0.34.0 ``_cache`` maps a key to one block id and ``_dup_ids`` holds, in
  insertion order, every id of a key cached by several blocks (and
  ``clear()`` empties both);
- the pool's event helpers: ``_generate_event_extra_keys`` and
  ``_lookahead_token_ids`` in 0.33.0, ``generate_event_extra_keys`` and
  ``get_lookahead_token_ids`` from 0.34.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvmodel.semantics import KNOWN_VERSIONS, release_key


class VllmInternalsChanged(AttributeError):
    """vLLM lays out an internal otherwise than the release kvcheck reads it as."""


def layout(version: str, layouts: dict[str, Any]) -> Any:
    """The entry of ``layouts`` (keyed by the first release using it) in force in ``version``."""
    key = release_key(version)
    found = [first for first in layouts if release_key(first) <= key]
    if not found:
        raise VllmInternalsChanged(f"vLLM {version}: no layout known before {min(layouts, key=release_key)}")
    return layouts[max(found, key=release_key)]


def attribute(obj: Any, name: str, version: str) -> Any:
    """``obj.name``, or :class:`VllmInternalsChanged` naming the release, the class and the attribute."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise VllmInternalsChanged(
            f"vLLM {version}: {type(obj).__name__} has no attribute {name!r} (kvcheck reads vLLM's internals "
            f"as releases {', '.join(KNOWN_VERSIONS)} lay them out: kvcheck/targets/vllm_internals.py)"
        ) from None


# -- the prefix-cache map (one reader per layout; each is inlined into exported tests) -------------


def cache_entries_0_33(pool: Any) -> list[tuple[bytes, int]]:
    """Every entry of the prefix-cache map as (block hash with group id, block id), in map order."""
    entries = []
    # One block under a key, or a dict of blocks by id.
    for key, blocks in pool.cached_block_hash_to_block._cache.items():
        for block in blocks.values() if isinstance(blocks, dict) else (blocks,):
            entries.append((key, block.block_id))
    return entries


def cache_entries_0_34(pool: Any) -> list[tuple[bytes, int]]:
    """Every entry of the prefix-cache map as (block hash with group id, block id), in map order."""
    cache_map = pool.cached_block_hash_to_block
    entries = []
    # One block id under a key; a key cached by several blocks lists them all in _dup_ids.
    for key, block_id in cache_map._cache.items():
        for each in cache_map._dup_ids.get(key, (block_id,)):
            entries.append((key, each))
    return entries


CACHE_ENTRIES: dict[str, Callable[[Any], list[tuple[bytes, int]]]] = {
    "0.33.0": cache_entries_0_33,
    "0.34.0": cache_entries_0_34,
}
"""The map reader of each layout, keyed by the first release that lays the map out so."""


def cache_entries(pool: Any, version: str) -> list[tuple[bytes, int]]:
    """The prefix-cache map's entries of a vLLM ``version`` pool, as (hash with group id, block id)."""
    reader = layout(version, CACHE_ENTRIES)
    cache_map = attribute(pool, "cached_block_hash_to_block", version)
    attribute(cache_map, "_cache", version)
    if reader is cache_entries_0_34:
        attribute(cache_map, "_dup_ids", version)
    entries: list[tuple[bytes, int]] = reader(pool)
    return entries


def clear_cache_map(pool: Any, version: str) -> None:
    """Empty the prefix-cache map as ``reset_prefix_cache`` does in ``version`` (0.33.0 builds a new
    map; 0.34.0 clears the one it has, which the startup ``gc.freeze()`` froze)."""
    if release_key(version) >= release_key("0.34.0"):
        attribute(pool.cached_block_hash_to_block, "clear", version)()
    else:
        pool.cached_block_hash_to_block = type(pool.cached_block_hash_to_block)()


# -- block fields ----------------------------------------------------------------------------------


def ref_counts(pool: Any) -> dict[int, int]:
    """``ref_cnt`` of every block but the null block."""
    return {block.block_id: block.ref_cnt for block in pool.blocks[1:]}


def hashed_blocks(pool: Any) -> list[tuple[bytes, int]]:
    """Every (key, block id) a block carries: its own hash, and the partial entries' keys the pool
    records for it (``cached_block_hashes_by_block``)."""
    return [(block.block_hash, block.block_id) for block in pool.blocks if block.block_hash] + [
        (key, block_id) for block_id, keys in pool.cached_block_hashes_by_block.items() for key in keys
    ]


def check_null_block(pool: Any) -> None:
    """Assert that block 0 is the null block and stays out of the free queue."""
    null = pool.null_block
    assert null.block_id == 0, f"the null block is block {null.block_id}, not 0"
    assert null.is_null, "block 0 lost its null mark"
    assert null.prev_free_block is None, "the null block is linked into the free queue"
    assert null.next_free_block is None, "the null block is linked into the free queue"


# -- the free queue --------------------------------------------------------------------------------


def walk_ids(node: Any, end: Any, limit: int, forward: bool) -> list[int]:
    """Block ids from ``node`` up to ``end`` by the forward (or backward) links.

    Bounded by ``limit`` so that a corrupted (cyclic) list still returns;
    callers compare lengths.
    """
    ids: list[int] = []
    while node is not None and node is not end and len(ids) <= limit:
        ids.append(node.block_id)
        node = node.next_free_block if forward else node.prev_free_block
    return ids


def forward_ids(queue: Any) -> list[int]:
    """A vLLM free queue's ids, head (next handed out) to tail."""
    return walk_ids(
        queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail, queue.num_free_blocks + 1, True
    )


def backward_ids(queue: Any) -> list[int]:
    """A vLLM free queue's ids walked tail to head by the backward links."""
    return walk_ids(
        queue.fake_free_list_tail.prev_free_block, queue.fake_free_list_head, queue.num_free_blocks + 1, False
    )


def check_free_list(queue: Any) -> None:
    """Assert that a vLLM free queue is a well-formed doubly linked list.

    The sentinels have no outer links, every link is answered by its partner,
    no block appears twice, and the walk has ``num_free_blocks`` blocks.
    """
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    assert head.prev_free_block is None, "the head sentinel has a predecessor"
    assert tail.next_free_block is None, "the tail sentinel has a successor"
    seen: set[int] = set()
    node = head
    while node is not tail:
        following = node.next_free_block
        assert following is not None, f"the forward walk stops at block {node.block_id} before the tail sentinel"
        assert following.prev_free_block is node, (
            f"link mismatch: {node.block_id}.next={following.block_id} "
            f"but {following.block_id}.prev={getattr(following.prev_free_block, 'block_id', None)}"
        )
        if following is not tail:
            assert id(following) not in seen, f"block {following.block_id} appears twice (cycle)"
            seen.add(id(following))
        node = following
    assert len(seen) == queue.num_free_blocks, f"{len(seen)} blocks linked, num_free_blocks={queue.num_free_blocks}"


# -- per-group tables ------------------------------------------------------------------------------


def group_managers(manager: Any) -> Sequence[Any]:
    """The manager's single-type managers, one per KV-cache group."""
    managers: Sequence[Any] = manager.coordinator.single_type_managers
    return managers


def group_tables(manager: Any, request_id: str) -> Any:
    """The request's blocks, one tuple (or list) per group, as the coordinator holds them."""
    return manager.coordinator.get_blocks(request_id)


def holding_request_ids(manager: Any) -> list[str]:
    """Every request id some group's manager holds a table for, in first-seen order."""
    held: dict[str, None] = {}
    for group_manager in group_managers(manager):
        held.update(dict.fromkeys(group_manager.req_to_blocks))
    return list(held)


# -- pool helpers the fault plants call --------------------------------------------------------------


def event_extra_keys(pool: Any, version: str) -> Callable[..., Any]:
    """The pool's helper giving a block's event extra keys: ``(request, start, end, mm_index)``."""
    name = (
        "generate_event_extra_keys" if release_key(version) >= release_key("0.34.0") else "_generate_event_extra_keys"
    )
    helper: Callable[..., Any] = attribute(pool, name, version)
    return helper


def lookahead_token_ids(pool: Any, version: str) -> Callable[[Any, int], list[int]]:
    """The pool's helper giving the lookahead tokens an event carries for a block ending at a token."""
    name = "get_lookahead_token_ids" if release_key(version) >= release_key("0.34.0") else "_lookahead_token_ids"
    helper: Callable[[Any, int], list[int]] = attribute(pool, name, version)
    return helper
