"""An EAGLE/MTP drafter: a prefix hit drops its last matched block, as vLLM 0.33.0 does.

Each case caches a 10-token prompt of one repeated token (blocks of 2
tokens), frees it, then looks up a second request of 8 or 9 such tokens.
The expected hits are those vLLM 0.33.0's own manager returns for the
same steps.
"""

from __future__ import annotations

import pytest

from kvcore import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
    hit_block_ids,
)
from kvcore.config import AttentionSpec
from kvcore.errors import InvalidConfig

BLOCK = 2
FULL = FullAttentionSpec(BLOCK)


def hit_after_cached_prompt(groups: tuple[AttentionSpec, ...], num_tokens: int, use_eagle: bool) -> tuple[int, list]:
    manager = KVCacheManager(KVCacheConfig(num_blocks=40, groups=groups, use_eagle=use_eagle))
    first = Request("a", [0] * 10, BLOCK)
    assert manager.allocate_slots(first, 10) is not None
    first.num_computed_tokens = 10
    manager.free(first)
    blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", [0] * num_tokens, BLOCK))
    manager.check_invariants()
    return hit_len_tokens, list(hit_block_ids(blocks))


@pytest.mark.parametrize(
    ("num_tokens", "plain", "eagle"),
    [(8, (6, [[1, 2, 3]]), (4, [[1, 2]])), (9, (8, [[1, 2, 3, 4]]), (6, [[1, 2, 3]]))],
)
def test_one_full_attention_group_drops_the_last_block_below_the_cap(num_tokens: int, plain, eagle) -> None:
    """With one group the lookup stops at the num_tokens - 1 cap and then drops a block: a
    block-aligned prompt of 8 tokens hits 4, not 6."""
    assert hit_after_cached_prompt((FULL,), num_tokens, use_eagle=False) == plain
    assert hit_after_cached_prompt((FULL,), num_tokens, use_eagle=True) == eagle


@pytest.mark.parametrize("num_tokens", [8, 9])
def test_hybrid_looks_one_block_past_the_cap_before_dropping(num_tokens: int) -> None:
    """With several groups the lookup may match the block past the cap (up to the last full block),
    then drops it: 8 and 9 tokens both hit 6."""
    assert hit_after_cached_prompt((FULL, FULL), num_tokens, use_eagle=True) == (6, [[1, 2, 3], [6, 7, 8]])


@pytest.mark.parametrize(
    ("num_tokens", "plain", "eagle"),
    [(8, (6, [[0, 2, 3]]), (4, [[1, 2]])), (9, (8, [[0, 0, 3, 4]]), (6, [[0, 2, 3]]))],
)
def test_sliding_window_needs_one_block_more_than_its_window_then_drops_it(num_tokens: int, plain, eagle) -> None:
    """A 4-token window needs 2 blocks before the boundary; with the drop it needs 3, the last of which
    is dropped, so the kept hit still covers its window."""
    window = (SlidingWindowSpec(BLOCK, sliding_window=4),)
    assert hit_after_cached_prompt(window, num_tokens, use_eagle=False) == plain
    assert hit_after_cached_prompt(window, num_tokens, use_eagle=True) == eagle


@pytest.mark.parametrize(
    ("num_tokens", "expected"), [(8, (6, [[1, 2, 3], [0, 0, 8]])), (9, (6, [[1, 2, 3], [0, 0, 8]]))]
)
def test_full_and_sliding_window_agree_on_the_dropped_hit(num_tokens: int, expected) -> None:
    """Full attention and a 3-token window, each dropping its last matched block, agree on 6 tokens."""
    groups = (FULL, SlidingWindowSpec(BLOCK, sliding_window=3))
    assert hit_after_cached_prompt(groups, num_tokens, use_eagle=True) == expected


def test_eagle_with_a_chunked_local_group_is_refused() -> None:
    """A chunked-local hit cannot drop a block, so the configuration is refused, naming the group."""
    groups = (FULL, ChunkedLocalAttentionSpec(BLOCK, attention_chunk_size=4))
    with pytest.raises(InvalidConfig, match=r"groups\[1\] is chunked local"):
        KVCacheConfig(num_blocks=8, groups=groups, use_eagle=True)
    assert KVCacheConfig(num_blocks=8, groups=groups, use_eagle=True, enable_caching=False).use_eagle
