"""Prefix caching through KVCacheManager with one full-attention group of block size 4."""

from __future__ import annotations

from kvcore import FullAttentionSpec, KVCacheConfig, KVCacheManager, Request, hit_block_ids
from tests.kvcore.snapshots import snapshot
from tests.kvcore.steps import BLOCK_SIZE, run_step, tokens


def make_manager(num_blocks: int = 8) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, groups=(FullAttentionSpec(BLOCK_SIZE),)))


def test_a_prefix_hit_touches_free_cached_blocks_out_of_the_queue() -> None:
    """A hit on ref-count-0 cached blocks takes them out of the free queue and gives them ref count 1."""
    manager = make_manager()
    request_a = Request("a", tokens(0, 9), BLOCK_SIZE)
    run_step(manager, request_a)
    assert manager.get_block_ids("a") == ([1, 2, 3],)
    manager.free(request_a)
    # Tail first: 3 is partial (uncached) and goes to the head, 2 and 1 are cached and go to the tail.
    assert manager.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]

    request_b = Request("b", [*tokens(0, 8), 500], BLOCK_SIZE)
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(request_b)
    assert hit_block_ids(hit_blocks) == ([1, 2],)
    assert hit_len_tokens == 8
    assert manager.free_block_ids() == [3, 4, 5, 6, 7, 2, 1], "a lookup alone changes nothing"
    assert manager.allocate_slots(request_b, 1, 8, hit_blocks) is not None
    assert manager.get_block_ids("b") == ([1, 2, 3],)
    assert manager.free_block_ids() == [4, 5, 6, 7]
    assert manager.ref_counts()[1] == 1
    assert manager.ref_counts()[2] == 1
    manager.check_invariants()


def test_a_prefix_hit_on_a_held_block_only_raises_its_ref_count() -> None:
    """A hit on blocks another running request holds shares them: ref count 2, free queue untouched."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    assert manager.free_block_ids() == [4, 5, 6, 7]
    request_b = Request("b", [*tokens(0, 8), 500], BLOCK_SIZE)
    assert run_step(manager, request_b) == 8
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert manager.free_block_ids() == [5, 6, 7]
    assert manager.ref_counts() == {1: 2, 2: 2, 3: 1, 4: 1, 5: 0, 6: 0, 7: 0}
    manager.check_invariants()


def test_admission_counts_free_hit_blocks_as_consumed() -> None:
    """A request whose hit blocks are free needs room for them too: they leave the queue when touched."""
    manager = make_manager(num_blocks=5)
    run_step(manager, Request("a", tokens(0, 8), BLOCK_SIZE))
    manager.free("a")
    assert manager.free_block_ids() == [3, 4, 2, 1]
    # b hits blocks 1 and 2 and needs 3 more: 5 in all, but only 4 are free.
    request_b = Request("b", [*tokens(0, 8), *tokens(500, 9)], BLOCK_SIZE)
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(request_b)
    assert hit_block_ids(hit_blocks) == ([1, 2],)
    assert manager.allocate_slots(request_b, 9, hit_len_tokens, hit_blocks) is None
    # With 2 fewer tokens it needs 2 new blocks plus the 2 hit blocks: exactly the 4 free.
    request_c = Request("c", [*tokens(0, 8), *tokens(500, 7)], BLOCK_SIZE)
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(request_c)
    assert manager.allocate_slots(request_c, 7, hit_len_tokens, hit_blocks) is not None
    assert manager.get_block_ids("c") == ([1, 2, 3, 4],)
    assert manager.free_block_ids() == []
    manager.check_invariants()


def test_a_block_aligned_prompt_never_hits_its_last_block() -> None:
    """The hit is capped at num_tokens - 1, so an 8-token prompt hits 1 block, and a 9-token one hits 2."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 8), BLOCK_SIZE))
    manager.free("a")
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("same", tokens(0, 8), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1],)
    assert hit_len_tokens == 4
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("longer", tokens(0, 9), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1, 2],)
    assert hit_len_tokens == 8
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("one", tokens(0, 4), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([],)
    assert hit_len_tokens == 0


def test_the_hit_stops_at_the_first_block_that_differs() -> None:
    """A prompt that diverges in its second block hits only the first, even if later tokens match."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 13), BLOCK_SIZE))
    diverging = tokens(0, 13)
    diverging[5] = 999
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", diverging, BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1],)
    assert hit_len_tokens == 4


def test_extra_keys_separate_otherwise_equal_prompts() -> None:
    """A prompt cached under one extra key (e.g. an adapter) is not hit by the same tokens under another."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE, extra_keys=("lora-1",)))
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 9), BLOCK_SIZE, ("lora-2",)))
    assert hit_len_tokens == 0
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("c", tokens(0, 9), BLOCK_SIZE, ("lora-1",)))
    assert hit_block_ids(hit_blocks) == ([1, 2],)


def test_freed_requests_are_evicted_oldest_first_through_the_manager() -> None:
    """New requests evict the cached blocks of the request freed first, its tail block before its head."""
    manager = make_manager(num_blocks=7)
    run_step(manager, Request("a", tokens(0, 8), BLOCK_SIZE))
    run_step(manager, Request("b", tokens(100, 8), BLOCK_SIZE))
    run_step(manager, Request("c", tokens(200, 8), BLOCK_SIZE))
    manager.free("b")
    manager.free("a")
    manager.free("c")
    assert manager.free_block_ids() == [4, 3, 2, 1, 6, 5]
    run_step(manager, Request("d", tokens(300, 12), BLOCK_SIZE))
    assert manager.get_block_ids("d") == ([4, 3, 2],)
    # b is gone and a lost its tail block; a's first block is still a hit.
    hit_blocks, _ = manager.get_computed_blocks(Request("b2", tokens(100, 8), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([],)
    hit_blocks, _ = manager.get_computed_blocks(Request("a2", tokens(0, 9), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1],)
    manager.check_invariants()


def test_reset_prefix_cache_is_refused_while_blocks_are_held() -> None:
    """reset_prefix_cache returns False and changes nothing while a request holds blocks."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    before = snapshot(manager)
    assert manager.reset_prefix_cache() is False
    assert snapshot(manager) == before


def test_reset_prefix_cache_succeeds_once_all_blocks_are_free_and_then_nothing_hits() -> None:
    """After every request is freed the reset empties the cache, keeps the free order, and later lookups miss."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    manager.free("a")
    free_order = manager.free_block_ids()
    assert manager.reset_prefix_cache() is True
    assert manager.cache_entries() == []
    assert manager.free_block_ids() == free_order
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 9), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([],)
    assert hit_len_tokens == 0
    manager.check_invariants()


def test_evicting_a_held_block_keeps_it_allocated_but_no_longer_hittable() -> None:
    """evict_blocks on a held block drops its cache entry only; once freed it is reused like an uncached block."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    manager.evict_blocks([2])
    assert manager.get_block_ids("a") == ([1, 2, 3],)
    assert manager.ref_counts()[2] == 1
    assert [block_id for _, block_id in manager.cache_entries()] == [1]
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 9), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1],)
    assert hit_len_tokens == 4
    manager.check_invariants()
    manager.free("a")
    # 3 and 2 are uncached now and go to the head; 1 is still cached and goes to the tail.
    assert manager.free_block_ids() == [3, 2, 4, 5, 6, 7, 1]


def test_evicting_a_free_block_leaves_it_in_place_in_the_queue() -> None:
    """evict_blocks on a free cached block drops the entry but does not move the block."""
    manager = make_manager()
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    manager.free("a")
    assert manager.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]
    manager.evict_blocks([1, 3])
    assert manager.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]
    assert [block_id for _, block_id in manager.cache_entries()] == [2]
    hit_blocks, _ = manager.get_computed_blocks(Request("b", tokens(0, 9), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([],)
    manager.check_invariants()


def test_two_blocks_cached_under_one_hash_survive_each_others_eviction() -> None:
    """Blocks are not de-duplicated: evicting one of two blocks cached under a hash leaves the other findable."""
    manager = make_manager(num_blocks=10)
    run_step(manager, Request("a", tokens(0, 9), BLOCK_SIZE))
    # b skips the prefix lookup (as for prompt logprobs), so it computes and caches its own copies.
    request_b = Request("b", tokens(0, 9), BLOCK_SIZE)
    assert manager.allocate_slots(request_b, 9) is not None
    assert manager.get_block_ids("b") == ([4, 5, 6],)
    assert sorted(block_id for _, block_id in manager.cache_entries()) == [1, 2, 4, 5]
    probe = Request("probe", tokens(0, 9), BLOCK_SIZE)
    hit_blocks, _ = manager.get_computed_blocks(probe)
    assert hit_block_ids(hit_blocks) == ([1, 2],), "the block cached first is found first"
    manager.evict_blocks([1])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(probe)
    assert hit_block_ids(hit_blocks) == ([4, 2],)
    assert hit_len_tokens == 8
    manager.evict_blocks([4])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(probe)
    assert hit_block_ids(hit_blocks) == ([],)
    assert hit_len_tokens == 0
    manager.check_invariants()


def test_generated_tokens_that_fill_a_block_are_cached_on_the_next_step() -> None:
    """A decode step that completes a block enters it in the cache, so a later request can hit it."""
    manager = make_manager()
    request_a = Request("a", tokens(0, 6), BLOCK_SIZE)
    run_step(manager, request_a)
    assert [block_id for _, block_id in manager.cache_entries()] == [1]
    request_a.append_output_token_ids([6, 7])
    run_step(manager, request_a, 2)
    assert manager.get_block_ids("a") == ([1, 2],)
    assert sorted(block_id for _, block_id in manager.cache_entries()) == [1, 2]
    hit_blocks, _ = manager.get_computed_blocks(Request("b", tokens(0, 9), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1, 2],)
