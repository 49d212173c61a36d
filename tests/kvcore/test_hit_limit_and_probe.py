"""vLLM 0.34.0's lookup bounds, side-effect-free probe and evict-first frees, through KVCacheManager and
BlockPool with one full-attention group of block size 4.

The expected hits and free queues are the ones vLLM 0.34.0 gives for the same steps.
"""

from __future__ import annotations

import pytest

from kvcore import FullAttentionSpec, InvalidArgument, KVCacheConfig, KVCacheManager, Request, hit_block_ids
from tests.kvcore.snapshots import snapshot
from tests.kvcore.steps import BLOCK_SIZE, run_step, tokens


def cached_prefix() -> KVCacheManager:
    """A manager whose prefix cache holds the first two blocks of tokens 0..8, both free (blocks 1 and 2)."""
    manager = KVCacheManager(KVCacheConfig(num_blocks=8, groups=(FullAttentionSpec(BLOCK_SIZE),)))
    request = Request("a", tokens(0, 9), BLOCK_SIZE)
    run_step(manager, request)
    manager.free(request)
    return manager


def test_a_hit_is_bounded_by_the_request_limit_and_an_explicit_bound() -> None:
    """The hit is capped at the least of num_tokens - 1, the request's limit and the caller's bound."""
    manager = cached_prefix()
    unbounded = Request("b", [*tokens(0, 8), 500], BLOCK_SIZE)
    assert manager.get_computed_blocks(unbounded)[1] == 8
    assert manager.get_computed_blocks(unbounded, max_cache_hit_length=5)[1] == 4
    limited = Request("c", [*tokens(0, 8), 500], BLOCK_SIZE, prefix_cache_hit_limit=6)
    blocks, hit_length = manager.get_computed_blocks(limited)
    assert (hit_block_ids(blocks), hit_length) == (([1],), 4)
    assert manager.get_computed_blocks(limited, max_cache_hit_length=100)[1] == 4, "a bound only lowers it"
    skipping = Request("d", [*tokens(0, 8), 500], BLOCK_SIZE, prefix_cache_hit_limit=0)
    assert manager.get_computed_blocks(skipping) == (([],), 0)


def test_the_probe_answers_the_lookup_and_changes_nothing() -> None:
    """get_num_cached_tokens finds what the lookup finds, capped at num_tokens - 1 but not at the request's
    limit (as vLLM 0.34.0 probes), 0 for a request that reads nothing; the state stays as it was."""
    manager = cached_prefix()
    before = snapshot(manager)
    request = Request("b", [*tokens(0, 8), 500], BLOCK_SIZE)
    assert manager.get_num_cached_tokens(request) == 8
    assert manager.get_num_cached_tokens(Request("c", tokens(0, 8), BLOCK_SIZE)) == 4, "the last token is computed"
    assert manager.get_num_cached_tokens(Request("d", [*tokens(0, 8), 1], BLOCK_SIZE, prefix_cache_hit_limit=6)) == 8
    assert manager.get_num_cached_tokens(Request("e", [*tokens(0, 8), 1], BLOCK_SIZE, prefix_cache_hit_limit=0)) == 0
    assert snapshot(manager) == before
    assert request.shared_prefix_boundary == 0
    manager.check_invariants()


def test_a_hit_limit_must_be_a_non_negative_int() -> None:
    with pytest.raises(InvalidArgument, match="prefix_cache_hit_limit"):
        Request("a", tokens(0, 4), BLOCK_SIZE, prefix_cache_hit_limit=-1)


def test_blocks_freed_evict_first_go_to_the_head_cached_or_not() -> None:
    """With evict_first, cached blocks reaching ref count 0 join the head like uncached ones, ahead of
    every other cached block; without it they join the tail."""
    manager = cached_prefix()
    pool = manager.block_pool
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]
    request = Request("b", [*tokens(0, 8), 500], BLOCK_SIZE)
    blocks, hit_length = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, 1, hit_length, blocks) is not None
    table = [pool.blocks[block_id] for block_id in manager.get_block_ids("b")[0]]
    pool.free_blocks(reversed(table), evict_first=True)
    assert pool.free_block_ids() == [3, 2, 1, 4, 5, 6, 7]
    pool.check_invariants()
