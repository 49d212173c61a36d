"""Hits that end inside a block (vLLM 0.33.0's fine-grained hits): an align-mode Mamba group whose blocks
are larger than the hashes, beside full attention.

The expected tables, copies, cache entries and free queues are the ones vLLM 0.33.0 produces for the
same steps (``tests/vllm/test_vllm_group_kinds.py`` drives both in lockstep).
"""

from __future__ import annotations

import pytest

from kvcore import (
    FullAttentionSpec,
    InvalidArgument,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    Request,
    RSWASpec,
    SlidingWindowSpec,
)

WIDE_STATES = MambaSpec(4, cache_mode="align")
PROMPT = [1, 2, 3, 4, 5, 6, 7]


def make_manager(num_blocks: int = 16) -> KVCacheManager:
    manager = KVCacheManager(KVCacheConfig(num_blocks, [FullAttentionSpec(2), WIDE_STATES]))
    assert manager.config.hash_block_size == 2 and manager.config.partial_hits
    return manager


def schedule(manager: KVCacheManager, request: Request, num_new_tokens: int) -> int:
    """One step; a request holding no blocks takes its hit first.  Returns the hit length."""
    hit_blocks, hit_length = None, 0
    if not manager.get_blocks(request.request_id)[0]:
        hit_blocks, hit_length = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, num_new_tokens, hit_length, hit_blocks) is not None
    request.num_computed_tokens += hit_length + num_new_tokens
    manager.new_step_starts()
    return hit_length


def cached_at(manager: KVCacheManager, block_id: int) -> bool:
    return any(entry_block == block_id for _, entry_block in manager.cache_entries())


def produce(manager: KVCacheManager) -> Request:
    """A 7-token prompt computed in chunks of 4 and 2 tokens: the state at its last hash boundary, 6,
    is cached inside block 1 of its Mamba table (block 0, the state at 4, is still read)."""
    request = Request("a", PROMPT, 2)
    schedule(manager, request, 4)
    schedule(manager, request, 2)
    assert manager.get_block_ids("a") == ([1, 2, 4], [3, 5])
    assert cached_at(manager, 5)
    return request


def test_a_state_cached_inside_the_block_its_request_writes_is_copied_for_the_cache() -> None:
    """The last token's step writes block 5: the state's cache entry moves to a new block, 7, and the
    copy 5 -> 7 is queued; both hold one reference more until the caller frees them, and the copy then
    sits free and cached at the queue's tail.  (The state at 4, block 3, is freed.)"""
    manager = make_manager()
    request = produce(manager)
    schedule(manager, request, 1)
    copies, retained = manager.take_block_copies()
    assert copies == [(5, 7)] and [block.block_id for block in retained] == [5, 7]
    assert manager.get_block_ids("a") == ([1, 2, 4, 6], [0, 5])
    assert not cached_at(manager, 5) and cached_at(manager, 7)
    assert manager.ref_counts()[5] == 2 and manager.ref_counts()[7] == 1
    manager.check_invariants()
    manager.free_retained_blocks(retained)
    assert manager.ref_counts()[5] == 1 and manager.free_block_ids()[-1] == 7
    manager.check_invariants()


def test_a_hit_ending_inside_a_state_block_takes_a_copy_of_it() -> None:
    """A request sharing 6 tokens hits the state at 6 in block 7: its table holds a new block, 8, in
    its place, the copy 7 -> 8 is queued, and the block the copy takes is counted."""
    manager = make_manager()
    request = produce(manager)
    schedule(manager, request, 1)
    manager.free_retained_blocks(manager.take_block_copies()[1])
    manager.free(request)
    other = Request("b", [*PROMPT[:6], 9, 9, 9], 2)
    blocks, hit_length = manager.get_computed_blocks(other)
    assert hit_length == 6 and [[b.block_id for b in group] for group in blocks] == [[1, 2, 4], [0, 7]]
    free_before = manager.block_pool.num_free_blocks
    assert schedule(manager, other, 3) == 6
    copies, retained = manager.take_block_copies()
    assert copies == [(7, 8)]
    assert manager.get_block_ids("b") == ([1, 2, 4, 5, 6], [0, 8, 9])
    # Hit blocks 1, 2, 4 and 7 left the queue; full attention took 2 new blocks, Mamba the copy and 1.
    assert manager.block_pool.num_free_blocks == free_before - 4 - 4
    manager.free_retained_blocks(retained)
    assert manager.block_pool.num_free_blocks == free_before - 7 and manager.free_block_ids()[-1] == 7
    manager.check_invariants()


def test_copy_endpoints_are_released_once_and_only_once() -> None:
    """Blocks that are not the endpoints of taken copies are refused, naming the block, and change nothing."""
    manager = make_manager()
    request = produce(manager)
    schedule(manager, request, 1)
    _, retained = manager.take_block_copies()
    manager.free_retained_blocks(retained)
    with pytest.raises(InvalidArgument, match="blocks"):
        manager.free_retained_blocks(retained)
    manager.check_invariants()


def test_a_window_hashed_finer_than_its_blocks_turns_sub_block_hits_off_and_r_swa_takes_them() -> None:
    """Beside a sliding window in 4-token blocks hashed every 2 tokens, sub-block hits are off (vLLM
    0.33.0's sliding window cannot stop a lookup inside a block): a 7-token prompt computed in chunks of
    4, 2 and 1 caches no state at its last hash boundary, 6, and a second request sharing 6 tokens hits
    4.  Beside R-SWA in the same blocks they are on (its lookup is full attention's): the state at 6 is
    cached (copied out of the block its request goes on writing), and the second request hits 6, copying
    both groups' blocks there on write.  Beside a sliding window hashed at its block size they are on."""
    hits = []
    for window in (SlidingWindowSpec(4, 3), RSWASpec(4, 3)):
        manager = KVCacheManager(KVCacheConfig(16, [window, WIDE_STATES], hash_block_size=2))
        assert manager.config.states_finer_than_hashes
        producer = Request("a", PROMPT, 2)
        for num_new_tokens in (4, 2, 1):
            schedule(manager, producer, num_new_tokens)
        manager.take_block_copies()
        consumer = Request("b", [*PROMPT[:6], 9, 9, 9], 2)
        hit_blocks, hit_length = manager.get_computed_blocks(consumer)
        assert manager.allocate_slots(consumer, 3, hit_length, hit_blocks) is not None
        hits.append((manager.config.partial_hits, hit_length, manager.take_block_copies()[0]))
    assert hits[0] == (False, 4, [])
    assert hits[1][:2] == (True, 6) and len(hits[1][2]) == 2
    assert KVCacheConfig(16, [SlidingWindowSpec(2, 3), WIDE_STATES]).partial_hits
    assert not KVCacheConfig(16, [FullAttentionSpec(4), WIDE_STATES]).partial_hits


def test_under_decode_context_parallelism_states_at_the_hash_size_ask_for_sub_block_hits() -> None:
    """Full attention in 2-token blocks sharded over 2 ranks (blocks of 4 tokens) beside Mamba states in
    2-token blocks, hashed every 2: the states ask for sub-block hits though their blocks are no larger
    than the hashes (on one rank they would not).  A 7-token prompt computed in chunks of 4, 2 and 1
    caches its state at its last hash boundary, 6, inside full attention's sharded block 1; a second
    request sharing 6 tokens hits 6 and copies that block on write."""
    specs = [FullAttentionSpec(2), MambaSpec(2, cache_mode="align")]
    one_rank = KVCacheConfig(16, specs)
    assert not one_rank.asks_for_sub_block_hits and not one_rank.partial_hits
    manager = KVCacheManager(KVCacheConfig(16, specs, dcp_world_size=2))
    config = manager.config
    assert (config.manager_block_sizes, config.hash_block_size, config.scheduler_block_size) == ((4, 2), 2, 4)
    assert config.asks_for_sub_block_hits and config.partial_hits and not config.states_finer_than_hashes
    producer = Request("a", PROMPT, 2)
    for num_new_tokens in (4, 2, 1):
        schedule(manager, producer, num_new_tokens)
    manager.take_block_copies()
    consumer = Request("b", [*PROMPT[:6], 9, 9], 2)
    hit_blocks, hit_length = manager.get_computed_blocks(consumer)
    assert hit_length == 6 and [len(blocks) for blocks in hit_blocks] == [2, 3]
    assert manager.allocate_slots(consumer, 2, hit_length, hit_blocks) is not None
    copies, _ = manager.take_block_copies()
    assert len(copies) == 1 and copies[0][0] == hit_blocks[0][1].block_id
    manager.check_invariants()


def test_each_cached_state_is_offered_with_its_block_and_boundary_then_drained() -> None:
    """take_boundary_state_offloads hands over, once, each state the Mamba group cached this far: the state
    at 4 tokens in block 3 (a whole block), under its request; the state at 6, cached inside block 5, only
    when the next allocation copies it, as its copy."""
    manager = make_manager()
    request = Request("a", PROMPT, 2)
    schedule(manager, request, 4)
    assert manager.take_boundary_state_offloads() == {"a": [(1, 3, 4)]}
    assert manager.take_boundary_state_offloads() == {}
    schedule(manager, request, 2)
    assert manager.take_boundary_state_offloads() == {}
    schedule(manager, request, 1)
    assert manager.take_block_copies()[0] == [(5, 7)]
    assert manager.take_boundary_state_offloads() == {"a": [(1, 7, 6)]}


def test_a_request_finishing_at_a_state_inside_its_block_offers_that_block_once() -> None:
    """Finishing right after caching its state at 6 inside block 5 (no later token reached it), the
    request's tail is offered from block 5; the record is then gone."""
    manager = make_manager()
    request = produce(manager)
    manager.take_boundary_state_offloads()
    assert manager.finalize_partial_tail_offloads(request) == [(1, 5, 6)]
    assert manager.finalize_partial_tail_offloads(request) == []


@pytest.mark.parametrize("in_flight", [True, False])
def test_a_finishing_request_whose_later_tokens_reach_its_states_block_offers_nothing(in_flight: bool) -> None:
    """A token past the state at 6 (computed, or still in flight) may have overwritten block 5: nothing is
    offered, and the record is dropped."""
    manager = make_manager()
    request = produce(manager)
    if in_flight:
        request.num_in_flight_tokens = 1
    else:
        request.num_computed_tokens += 1
    assert manager.finalize_partial_tail_offloads(request) == []
    request.num_in_flight_tokens, request.num_computed_tokens = 0, 6
    assert manager.finalize_partial_tail_offloads(request) == []


def test_a_freed_requests_offers_not_taken_are_dropped() -> None:
    """The request is freed before its offer of block 3 is taken: the block goes back to the pool, and so
    does the offer (another request may get the block)."""
    manager = make_manager()
    request = Request("a", PROMPT, 2)
    schedule(manager, request, 4)
    manager.free(request)
    assert manager.take_boundary_state_offloads() == {}
    assert manager.finalize_partial_tail_offloads(request) == []
