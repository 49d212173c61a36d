"""Groups of different block sizes, the scheduler and hash block sizes, and partial prefix entries.

The expected tables, cache entries and events are the ones vLLM 0.33.0 produces for the same steps.
"""

from __future__ import annotations

from collections import Counter

from kvcore import (
    BlockRemoved,
    BlockStored,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)


def step(manager: KVCacheManager, request: Request, num_new_tokens: int) -> None:
    assert manager.allocate_slots(request, num_new_tokens) is not None
    request.num_computed_tokens += num_new_tokens
    if request.num_computed_tokens == request.num_tokens:
        request.append_output_token_ids(request.num_tokens + 1)  # the prompt counts on: 8, 9, ...


def entries_per_group(manager: KVCacheManager) -> Counter[tuple[int, int]]:
    """(group, block id) of every prefix-cache entry, counted."""
    return Counter((group_id, block_id) for (_, group_id), block_id in manager.cache_entries())


def stored(event: object) -> tuple[str, int, tuple[int, ...], int] | tuple[str, int]:
    if isinstance(event, BlockStored):
        return "stored", event.group_idx, event.token_ids, event.block_size
    assert isinstance(event, BlockRemoved)
    return "removed", event.group_idx


def test_an_engine_picks_the_least_common_multiple_to_schedule_and_the_greatest_common_divisor_to_hash() -> None:
    full4, window2 = FullAttentionSpec(4), SlidingWindowSpec(2, sliding_window=4)
    config = KVCacheConfig(8, (full4, window2, FullAttentionSpec(6)))
    assert (config.scheduler_block_size, config.hash_block_size) == (12, 2)
    assert KVCacheConfig(8, (full4, window2), enable_caching=False).hash_block_size == 4
    assert KVCacheConfig(8, (full4, MambaSpec(2)), enable_caching=False).hash_block_size == 4
    assert KVCacheConfig(8, (full4,)).hash_block_size == 4


def test_a_full_attention_block_holding_the_prompts_last_hash_boundary_gets_a_partial_key_once_full() -> None:
    """Full attention in 4-token blocks beside a 4-token window in 2-token blocks (hashes of 2, hits of
    4): a 7-token prompt caches up to token 4; two tokens later its second full-attention block is
    cached, and then entered under the boundary after token 6 too (a second key)."""
    manager = KVCacheManager(
        KVCacheConfig(16, (FullAttentionSpec(4), SlidingWindowSpec(2, sliding_window=4)), enable_kv_cache_events=True)
    )
    request = Request("a", list(range(1, 8)), 2)
    step(manager, request, 7)
    assert manager.get_block_ids("a") == ([1, 2], [3, 4, 5, 6])
    assert entries_per_group(manager) == Counter({(0, 1): 1, (1, 3): 1, (1, 4): 1})
    assert [stored(e) for e in manager.take_events()] == [
        ("stored", 0, (1, 2, 3, 4), 4),
        ("stored", 1, (1, 2, 3, 4), 2),
    ]
    step(manager, request, 1)
    step(manager, request, 1)
    assert manager.get_block_ids("a") == ([1, 2, 7], [0, 0, 5, 6, 8])
    assert entries_per_group(manager) == Counter({(0, 1): 1, (0, 2): 2, (1, 3): 1, (1, 4): 1, (1, 5): 1, (1, 6): 1})
    assert [stored(e) for e in manager.take_events()] == [
        ("stored", 0, (5, 6, 7, 8), 4),
        ("stored", 0, (5, 6), 2),
        ("stored", 1, (5, 6, 7, 8), 2),
    ]
    # Evicting the block drops both keys, its own first.
    manager.free(request)
    manager.evict_blocks([2])
    assert [stored(e) for e in manager.take_events()] == [("removed", 0), ("removed", 0)]
    manager.check_invariants()


def test_a_group_that_drops_caches_the_boundary_first_and_trades_it_for_the_full_key_later() -> None:
    """With an EAGLE drafter a dropping group caches up to the finalized tokens: the block holding the
    prompt's last hash boundary is entered under it while not yet full; once full, that entry is
    removed, the block entered under its own key, then under the boundary again."""
    groups = (FullAttentionSpec(4), FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=8))
    manager = KVCacheManager(KVCacheConfig(16, groups, use_eagle=True, hash_block_size=2, enable_kv_cache_events=True))
    request = Request("a", list(range(1, 8)), 2)
    step(manager, request, 7)
    assert manager.get_block_ids("a") == ([1, 2], [3, 4], [5, 6])
    assert entries_per_group(manager) == Counter({(0, 1): 1, (0, 2): 1, (1, 3): 1, (1, 4): 1, (2, 5): 1})
    assert [stored(e) for e in manager.take_events()] == [
        ("stored", 0, (1, 2, 3, 4), 4),
        ("stored", 0, (5, 6), 2),
        ("stored", 1, (1, 2, 3, 4), 4),
        ("stored", 1, (5, 6), 2),
        ("stored", 2, (1, 2, 3, 4), 4),
    ]
    step(manager, request, 1)
    assert entries_per_group(manager) == Counter({(0, 1): 1, (0, 2): 2, (1, 3): 1, (1, 4): 2, (2, 5): 1, (2, 6): 1})
    assert [stored(e) for e in manager.take_events()] == [
        ("removed", 0),
        ("stored", 0, (5, 6, 7, 8), 4),
        ("stored", 0, (5, 6), 2),
        ("removed", 1),
        ("stored", 1, (5, 6, 7, 8), 4),
        ("stored", 1, (5, 6), 2),
        ("stored", 2, (5, 6, 7, 8), 4),
    ]
    manager.check_invariants()


def test_a_window_whose_hits_land_several_blocks_apart_caches_only_the_blocks_a_hit_needs() -> None:
    """A 3-token window in 2-token blocks beside 4-token full attention: hits land every 4 tokens and
    need one window block before the boundary, so only blocks 1, 3, ... are cached; a later request
    sharing 9 tokens hits 8 of them."""
    manager = KVCacheManager(KVCacheConfig(24, (FullAttentionSpec(4), SlidingWindowSpec(2, sliding_window=3))))
    first = Request("a", list(range(1, 11)), 2)
    step(manager, first, 10)
    window_positions = sorted(
        manager.get_block_ids("a")[1].index(block_id)
        for (_, group_id), block_id in manager.cache_entries()
        if group_id == 1
    )
    assert window_positions == [1, 3]
    manager.free(first)
    second = Request("b", [*range(1, 10), 99], 2)
    hit, hit_length = manager.get_computed_blocks(second)
    assert hit_length == 8
    assert [len(group) for group in hit] == [2, 4]
