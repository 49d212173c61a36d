"""A drafter's lookahead: block hashes that cover the next tokens, the prefill lookahead, drafter groups.

The expected hits and cache entries are those vLLM 0.33.0's own manager
gives for the same calls (hashes built by its engine's block hasher).
"""

from __future__ import annotations

import pytest

from kvcore import FullAttentionSpec, KVCacheConfig, KVCacheManager, Request, SlidingWindowSpec, hit_block_ids
from kvcore.errors import InvalidConfig

FULL = FullAttentionSpec(2)


def cached_then_looked_up(
    config: KVCacheConfig, first: list[int], second: list[int], lookahead: int = 0
) -> tuple[int, list[list[int]], int]:
    """Compute ``first`` whole, free it, look ``second`` up: (hit tokens, hit block ids, blocks ``first`` cached)."""
    manager = KVCacheManager(config)
    request = Request("a", first, 2, num_hash_lookahead_tokens=lookahead)
    assert manager.allocate_slots(request, len(first)) is not None
    request.num_computed_tokens = len(first)
    num_cached = len(manager.cache_entries())
    manager.free(request)
    blocks, hit = manager.get_computed_blocks(Request("b", second, 2, num_hash_lookahead_tokens=lookahead))
    manager.check_invariants()
    return hit, [list(ids) for ids in hit_block_ids(blocks)], num_cached


def test_a_hash_that_looks_ahead_exists_once_the_tokens_after_its_block_do() -> None:
    """With 2 lookahead tokens a 7-token prompt hashes 2 blocks of 2 (the third block lacks its lookahead)."""
    assert len(Request("a", list(range(7)), 2, num_hash_lookahead_tokens=2).block_hashes) == 2
    assert len(Request("a", list(range(7)), 2).block_hashes) == 3
    request = Request("a", list(range(7)), 2, num_hash_lookahead_tokens=2)
    request.append_output_token_ids(7)
    assert len(request.block_hashes) == 3


def test_a_block_followed_by_other_tokens_is_a_miss() -> None:
    """The same block followed by a different next token is another key: the hit stops before it."""
    config = KVCacheConfig(num_blocks=12, groups=(FULL,))
    assert cached_then_looked_up(config, [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], lookahead=1)[:2] == (4, [[1, 2]])
    assert cached_then_looked_up(config, [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 9, 5], lookahead=1)[:2] == (2, [[1]])
    assert cached_then_looked_up(config, [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 9, 5])[:2] == (4, [[1, 2]])


def test_a_hit_never_passes_the_hashed_blocks() -> None:
    """Two lookahead tokens: a 5-token request has 1 hashed block, so its hit stops there, and a
    sliding-window lookup does not read past the hashes."""
    full = KVCacheConfig(num_blocks=12, groups=(FULL,))
    assert cached_then_looked_up(full, [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4], lookahead=2)[:2] == (2, [[1]])
    window = KVCacheConfig(num_blocks=12, groups=(SlidingWindowSpec(2, 3),))
    assert cached_then_looked_up(window, [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4], lookahead=2)[:2] == (2, [[1]])


@pytest.mark.parametrize(("prefill_lookahead", "cached"), [(0, 3), (1, 3), (2, 2)])
def test_the_tokens_a_drafter_may_prefill_again_are_never_cached(prefill_lookahead: int, cached: int) -> None:
    """A 6-token prompt fills 3 blocks; with a prefill lookahead of 2 its last token may be prefilled
    again, so its block is not cached."""
    config = KVCacheConfig(num_blocks=12, groups=(FULL,), num_prefill_lookahead=prefill_lookahead)
    assert cached_then_looked_up(config, list(range(6)), list(range(6)))[2] == cached


def test_in_a_hybrid_cache_only_the_groups_that_drop_keep_reprefillable_tokens_out() -> None:
    """Two full groups of different windows; the drafter is in group 0 only: group 0 caches 2 of the 3
    blocks, group 1 all 3."""
    config = KVCacheConfig(
        num_blocks=20,
        groups=(FULL, SlidingWindowSpec(2, 8)),
        use_eagle=True,
        eagle_group_ids=(0,),
        num_prefill_lookahead=2,
    )
    manager = KVCacheManager(config)
    request = Request("a", list(range(6)), 2)
    assert manager.allocate_slots(request, 6) is not None
    groups = sorted(group for (_, group), _ in manager.cache_entries())
    assert groups == [0, 0, 1, 1, 1]


def resend_hit_after_the_window_lost_its_last_block(config: KVCacheConfig) -> int:
    """An 8-token prompt is cached in both groups, the window group's last block is evicted, and the
    same prompt is looked up again."""
    manager = KVCacheManager(config)
    first = Request("a", list(range(8)), 2)
    assert manager.allocate_slots(first, 8) is not None
    first.num_computed_tokens = 8
    window_last_block = manager.get_block_ids("a")[1][3]
    manager.free(first)
    manager.evict_blocks([window_last_block])
    return manager.get_computed_blocks(Request("b", list(range(8)), 2))[1]


def test_only_the_drafter_groups_drop_a_block() -> None:
    """Full attention holds the drafter, the window does not: the window needs no peek at its
    evicted last block, so the resend hits 6 tokens; with the drafter in every group, 4."""
    groups = (FULL, SlidingWindowSpec(2, 3))
    every = KVCacheConfig(num_blocks=30, groups=groups, use_eagle=True)
    drafter_in_full = KVCacheConfig(num_blocks=30, groups=groups, use_eagle=True, eagle_group_ids=(0,))
    assert resend_hit_after_the_window_lost_its_last_block(every) == 4
    assert resend_hit_after_the_window_lost_its_last_block(drafter_in_full) == 6


def test_a_drafter_whose_prefill_lookahead_outgrows_a_block_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="num_prefill_lookahead"):
        KVCacheConfig(num_blocks=4, groups=(FULL,), use_eagle=True, num_prefill_lookahead=3)
    KVCacheConfig(num_blocks=4, groups=(FULL,), num_prefill_lookahead=3)  # no drafter group: accepted


def test_a_drafter_group_must_exist() -> None:
    with pytest.raises(InvalidConfig, match=r"eagle_group_ids\[0\]"):
        KVCacheConfig(num_blocks=4, groups=(FULL,), use_eagle=True, eagle_group_ids=(1,))
