"""Single-group managers through KVCacheManager: LIFO reuse, sliding window, chunked local attention, refusals."""

from __future__ import annotations

import pytest

from kvcore import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
    hit_block_ids,
)
from tests.kvcore.snapshots import snapshot
from tests.kvcore.steps import BLOCK_SIZE, run_step, tokens


def make_manager(spec: AttentionSpec, num_blocks: int = 10, enable_caching: bool = True) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, groups=(spec,), enable_caching=enable_caching))


def test_freed_blocks_are_reused_lifo_when_caching_is_off() -> None:
    """With caching off, the next request gets the blocks of the request freed last, its tail block first."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), num_blocks=8, enable_caching=False)
    run_step(manager, Request("a", tokens(0, 10), BLOCK_SIZE))
    run_step(manager, Request("b", tokens(0, 5), BLOCK_SIZE))
    assert manager.get_block_ids("a") == ([1, 2, 3],)
    assert manager.get_block_ids("b") == ([4, 5],)
    manager.free("a")
    manager.free("b")
    assert manager.free_block_ids() == [5, 4, 3, 2, 1, 6, 7]
    # Caching is off: the identical prompt gets no hit and reuses the hottest ids.
    assert run_step(manager, Request("c", tokens(0, 10), BLOCK_SIZE)) == 0
    assert manager.get_block_ids("c") == ([5, 4, 3],)
    assert manager.cache_entries() == []
    manager.check_invariants()


def test_sliding_window_frees_blocks_that_leave_the_window_tail_first_when_caching_is_off() -> None:
    """Once 16 tokens are computed with window 8, blocks 0-1 are freed (1 before 0), nulled, and reused at once."""
    manager = make_manager(SlidingWindowSpec(BLOCK_SIZE, sliding_window=8), enable_caching=False)
    request = Request("r", tokens(0, 24), BLOCK_SIZE)
    run_step(manager, request, 16)
    assert manager.get_block_ids("r") == ([1, 2, 3, 4],)
    # 16 - 8 + 1 = 9 tokens are outside every future window: blocks 0 and 1.
    run_step(manager, request, 8)
    assert manager.get_block_ids("r") == ([0, 0, 3, 4, 2, 1],)
    assert manager.free_block_ids() == [5, 6, 7, 8, 9]
    manager.check_invariants()


def test_sliding_window_frees_cached_blocks_to_the_tail_when_caching_is_on() -> None:
    """With caching on, the blocks leaving the window stay cached and queue at the tail, tail block first."""
    manager = make_manager(SlidingWindowSpec(BLOCK_SIZE, sliding_window=8))
    request = Request("r", tokens(0, 24), BLOCK_SIZE)
    run_step(manager, request, 16)
    run_step(manager, request, 8)
    assert manager.get_block_ids("r") == ([0, 0, 3, 4, 5, 6],)
    assert manager.free_block_ids() == [7, 8, 9, 2, 1]
    assert manager.ref_counts()[1] == 0
    assert sorted(block_id for _, block_id in manager.cache_entries()) == [1, 2, 3, 4, 5, 6]
    manager.check_invariants()


def test_sliding_window_decode_frees_each_block_once_the_window_has_passed_it() -> None:
    """Decoding one token at a time with window 8 frees block 0 at 11 computed tokens and block 1 at 15."""
    manager = make_manager(SlidingWindowSpec(BLOCK_SIZE, sliding_window=8), enable_caching=False)
    request = Request("r", tokens(0, 10), BLOCK_SIZE)
    run_step(manager, request)
    assert manager.get_block_ids("r") == ([1, 2, 3],)
    expected_tables = {
        10: [1, 2, 3],  # 10 - 8 + 1 = 3 tokens skipped: no whole block yet.
        11: [0, 2, 3],  # 4 tokens skipped: block 0 is out.
        12: [0, 2, 3, 1],  # 5 tokens skipped; the new block reuses the freed one.
        13: [0, 2, 3, 1],
        14: [0, 2, 3, 1],
        15: [0, 0, 3, 1],  # 8 tokens skipped: block 1 is out.
        16: [0, 0, 3, 1, 2],
    }
    for num_computed_tokens, expected_table in expected_tables.items():
        assert request.num_computed_tokens == num_computed_tokens
        request.append_output_token_ids(num_computed_tokens)
        run_step(manager, request, 1)
        assert manager.get_block_ids("r") == (expected_table,), f"after {num_computed_tokens} computed tokens"
    manager.check_invariants()


@pytest.mark.parametrize(
    ("sliding_window", "expected_hit_ids", "expected_hit_len_tokens"),
    [
        (5, [0, 0, 0, 0, 5], 20),  # needs ceil(4 / 4) = 1 block before the boundary
        (8, [0, 0, 0, 4, 5], 20),  # needs ceil(7 / 4) = 2
        (9, [0, 0, 0, 4, 5], 20),  # needs ceil(8 / 4) = 2
        (10, [0, 0, 3, 4, 5], 20),  # needs ceil(9 / 4) = 3
        (14, [1], 4),  # needs ceil(13 / 4) = 4: the run behind 20 is 3 long; only block 0 is a hit
    ],
)
def test_sliding_window_hit_needs_only_the_last_window_of_blocks(
    sliding_window: int, expected_hit_ids: list[int], expected_hit_len_tokens: int
) -> None:
    """A hit needs ceil((W - 1) / block_size) cached blocks before its boundary; earlier positions come back null."""
    manager = make_manager(SlidingWindowSpec(BLOCK_SIZE, sliding_window))
    run_step(manager, Request("a", tokens(0, 20), BLOCK_SIZE))
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5],)
    manager.free("a")
    manager.evict_blocks([2])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 21), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == (expected_hit_ids,)
    assert hit_len_tokens == expected_hit_len_tokens


def test_sliding_window_hit_falls_back_to_an_earlier_boundary_with_enough_cached_blocks() -> None:
    """With window 8, evicting the block before the longest boundary moves the hit to the next full run."""
    manager = make_manager(SlidingWindowSpec(BLOCK_SIZE, sliding_window=8))
    run_step(manager, Request("a", tokens(0, 20), BLOCK_SIZE))
    manager.free("a")
    manager.evict_blocks([4])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 21), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([0, 2, 3],)
    assert hit_len_tokens == 12


def test_taking_a_sliding_window_hit_touches_only_the_blocks_inside_the_window() -> None:
    """Admitting a 20-token hit with window 8 touches the last two hit blocks and nulls the three before."""
    manager = make_manager(SlidingWindowSpec(BLOCK_SIZE, sliding_window=8))
    run_step(manager, Request("a", tokens(0, 20), BLOCK_SIZE))
    manager.free("a")
    assert manager.free_block_ids() == [6, 7, 8, 9, 5, 4, 3, 2, 1]
    request_b = Request("b", tokens(0, 21), BLOCK_SIZE)
    assert run_step(manager, request_b) == 20
    assert manager.get_block_ids("b") == ([0, 0, 0, 4, 5, 6],)
    assert manager.free_block_ids() == [7, 8, 9, 3, 2, 1]
    assert manager.ref_counts()[4] == 1
    assert manager.ref_counts()[1] == 0
    manager.check_invariants()


def test_chunked_local_attention_frees_blocks_before_the_current_chunk() -> None:
    """With chunk 8, computing past token 8 frees blocks 0-1 tail first and nulls them; caching off reuses them."""
    manager = make_manager(ChunkedLocalAttentionSpec(BLOCK_SIZE, attention_chunk_size=8), enable_caching=False)
    request = Request("r", tokens(0, 20), BLOCK_SIZE)
    run_step(manager, request, 12)
    assert manager.get_block_ids("r") == ([1, 2, 3],)
    run_step(manager, request, 8)  # 12 computed: the first chunk (8 tokens) is skipped.
    assert manager.get_block_ids("r") == ([0, 0, 3, 2, 1],)
    assert manager.free_block_ids() == [4, 5, 6, 7, 8, 9]
    manager.check_invariants()


def test_chunked_local_attention_keeps_freed_cached_blocks_at_the_tail() -> None:
    """With caching on, the blocks of a finished chunk stay cached and queue at the tail, tail block first."""
    manager = make_manager(ChunkedLocalAttentionSpec(BLOCK_SIZE, attention_chunk_size=8))
    request = Request("r", tokens(0, 6), BLOCK_SIZE)
    assert run_step(manager, request) == 0
    request.append_output_token_ids(tokens(6, 6))
    run_step(manager, request, 6)
    assert manager.get_block_ids("r") == ([1, 2, 3],)
    request.append_output_token_ids(12)
    run_step(manager, request, 1)  # 12 computed: the first chunk (blocks 0-1) is skipped.
    assert manager.get_block_ids("r") == ([0, 0, 3, 4],)
    assert manager.free_block_ids() == [5, 6, 7, 8, 9, 2, 1]
    assert sorted(block_id for _, block_id in manager.cache_entries()) == [1, 2, 3]
    manager.check_invariants()


def test_chunked_local_attention_hit_treats_earlier_chunks_as_null() -> None:
    """A hit only looks up the chunk holding its end; earlier chunks count as hit with null blocks."""
    manager = make_manager(ChunkedLocalAttentionSpec(BLOCK_SIZE, attention_chunk_size=8))
    request_a = Request("a", tokens(0, 20), BLOCK_SIZE)
    # Even with nothing cached, the two chunks before token 19's chunk are a 16-token hit of null blocks.
    assert run_step(manager, request_a) == 16
    assert manager.get_block_ids("a") == ([0, 0, 0, 0, 1],)
    manager.free("a")
    request_b = Request("b", tokens(0, 21), BLOCK_SIZE)
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(request_b)
    assert hit_block_ids(hit_blocks) == ([0, 0, 0, 0, 1],)
    assert hit_len_tokens == 20
    # A lookup ending 2 tokens into a chunk has no full block of that chunk to look up.
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("c", tokens(900, 19), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([0, 0, 0, 0],)
    assert hit_len_tokens == 16
    assert run_step(manager, request_b) == 20
    assert manager.get_block_ids("b") == ([0, 0, 0, 0, 1, 2],)
    manager.evict_blocks([1])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("d", tokens(0, 21), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([0, 0, 0, 0],)
    assert hit_len_tokens == 16
    manager.check_invariants()


def test_a_refused_allocation_for_a_new_request_changes_nothing() -> None:
    """allocate_slots returning None for a new request with free hit blocks leaves every observation as it was."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), num_blocks=6)
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    manager.free("a")
    run_step(manager, Request("h", tokens(100, 8), BLOCK_SIZE))
    assert manager.get_block_ids("h") == ([3, 4],)
    assert manager.free_block_ids() == [5, 2, 1]
    request_b = Request("b", [*tokens(0, 8), *tokens(200, 9)], BLOCK_SIZE)
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(request_b)
    assert hit_block_ids(hit_blocks) == ([1, 2],)
    before = snapshot(manager)
    assert manager.allocate_slots(request_b, 9, hit_len_tokens, hit_blocks) is None
    assert manager.allocate_slots(request_b, 1, hit_len_tokens, hit_blocks, num_external_computed_tokens=8) is None
    assert snapshot(manager) == before
    assert "b" not in manager.request_ids()
    manager.check_invariants()


def test_a_refused_allocation_for_a_running_request_changes_nothing() -> None:
    """allocate_slots returning None for a running request leaves its table and the pool as they were."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), num_blocks=6)
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    manager.free("a")
    request_h = Request("h", tokens(100, 24), BLOCK_SIZE)
    run_step(manager, request_h, 8)
    before = snapshot(manager)
    assert manager.allocate_slots(request_h, 16) is None
    assert manager.allocate_slots(request_h, 4, num_lookahead_tokens=12) is None
    assert snapshot(manager) == before
    run_step(manager, request_h, 12)
    assert manager.get_block_ids("h") == ([3, 4, 5, 2, 1],)
    manager.check_invariants()


def test_a_refused_sliding_window_allocation_still_frees_blocks_outside_the_window() -> None:
    """As in vLLM, blocks that left the window are freed even when the allocation itself is refused."""
    manager = make_manager(SlidingWindowSpec(BLOCK_SIZE, sliding_window=8), num_blocks=6, enable_caching=False)
    request = Request("r", tokens(0, 40), BLOCK_SIZE)
    run_step(manager, request, 16)
    assert manager.get_block_ids("r") == ([1, 2, 3, 4],)
    assert manager.allocate_slots(request, 16) is None
    assert manager.get_block_ids("r") == ([0, 0, 3, 4],)
    assert manager.free_block_ids() == [2, 1, 5]
    manager.check_invariants()
