"""Async scheduling: windows on processed tokens, deferred frees, and loads cached once they land.

The expected block ids are those vLLM 0.33.0's own manager gives for the
same calls.
"""

from __future__ import annotations

import pytest

from kvcore import FullAttentionSpec, KVCacheConfig, KVCacheManager, Request, SlidingWindowSpec
from kvcore.errors import InvalidArgument

WINDOW = SlidingWindowSpec(1, 2)


def test_a_window_keeps_the_blocks_a_step_in_flight_reads() -> None:
    """Step 2 is scheduled while step 1 (4 tokens) is in flight: the window slides over processed
    tokens only, so nothing is released; once step 1 is processed the next step releases blocks 1-3."""
    manager = KVCacheManager(KVCacheConfig(num_blocks=10, groups=(WINDOW,)))
    request = Request("a", [0, 1, 2, 3, 4, 5], 1)
    assert manager.allocate_slots(request, 4) is not None
    request.num_computed_tokens = request.num_in_flight_tokens = 4
    assert manager.allocate_slots(request, 1) is not None
    request.num_computed_tokens, request.num_in_flight_tokens = 5, 5
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5],)
    request.num_in_flight_tokens = 1  # step 1's output is processed
    assert manager.allocate_slots(request, 1) is not None
    assert manager.get_block_ids("a") == ([0, 0, 0, 4, 5, 6],)
    manager.check_invariants()


def test_without_steps_in_flight_the_window_slides_on_computed_tokens() -> None:
    manager = KVCacheManager(KVCacheConfig(num_blocks=10, groups=(WINDOW,)))
    request = Request("a", [0, 1, 2, 3, 4, 5], 1)
    assert manager.allocate_slots(request, 4) is not None
    request.num_computed_tokens = 4
    assert manager.allocate_slots(request, 1) is not None
    assert manager.get_block_ids("a") == ([0, 0, 0, 4, 5],)


def test_popped_blocks_stay_held_until_freed_tail_first() -> None:
    """pop_blocks_for_free forgets the request but keeps its blocks referenced; freeing them later
    puts them in the free queue as a plain free would (cached tail first at the queue's tail)."""
    manager = KVCacheManager(KVCacheConfig(num_blocks=6, groups=(FullAttentionSpec(1),)))
    request = Request("a", [0, 1, 2], 1)
    assert manager.allocate_slots(request, 3) is not None
    request.num_computed_tokens = 3
    popped = manager.pop_blocks_for_free(request)
    assert [block.block_id for block in popped] == [1, 2, 3]
    assert manager.request_ids() == []
    assert manager.free_block_ids() == [4, 5]
    assert [manager.ref_counts()[b] for b in (1, 2, 3)] == [1, 1, 1]
    manager.check_invariants()
    manager.free_popped_blocks(popped)
    assert manager.free_block_ids() == [4, 5, 3, 2, 1]
    manager.check_invariants()


def test_freeing_blocks_that_were_not_popped_raises_and_changes_nothing() -> None:
    manager = KVCacheManager(KVCacheConfig(num_blocks=6, groups=(FullAttentionSpec(1),)))
    request = Request("a", [0, 1], 1)
    assert manager.allocate_slots(request, 2) is not None
    popped = manager.pop_blocks_for_free(request)
    manager.free_popped_blocks(popped)
    before = manager.free_block_ids()
    with pytest.raises(InvalidArgument, match="pop_blocks_for_free"):
        manager.free_popped_blocks(popped)
    assert manager.free_block_ids() == before
    manager.check_invariants()


def test_pop_leaves_out_a_windows_leading_null_blocks() -> None:
    manager = KVCacheManager(KVCacheConfig(num_blocks=10, groups=(WINDOW,)))
    request = Request("a", [0, 1, 2, 3, 4], 1)
    assert manager.allocate_slots(request, 4) is not None
    request.num_computed_tokens = 4
    assert manager.allocate_slots(request, 1) is not None
    assert [block.block_id for block in manager.pop_blocks_for_free(request)] == [4, 5]


def test_a_delayed_load_is_cached_only_when_the_caller_says_it_landed() -> None:
    """Tokens loaded asynchronously get blocks at once but enter the prefix cache only at cache_blocks."""
    manager = KVCacheManager(KVCacheConfig(num_blocks=10, groups=(FullAttentionSpec(2),)))
    loading = Request("a", [0, 1, 2, 3, 4], 2)
    assert manager.allocate_slots(loading, 0, num_external_computed_tokens=4, delay_cache_blocks=True) is not None
    loading.num_computed_tokens = 4
    assert manager.get_block_ids("a") == ([1, 2],)
    assert manager.cache_entries() == []
    assert manager.get_computed_blocks(Request("b", [0, 1, 2, 3, 4], 2))[1] == 0
    manager.cache_blocks(loading, loading.num_computed_tokens)
    assert sorted(block_id for _, block_id in manager.cache_entries()) == [1, 2]
    assert manager.get_computed_blocks(Request("b", [0, 1, 2, 3, 4], 2))[1] == 4
    manager.check_invariants()
