"""Hybrid KV caches: several groups over one pool agree on a hit, and never put one block in two places."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from kvcore import FullAttentionSpec, KVCacheConfig, KVCacheManager, Request, SlidingWindowSpec, hit_block_ids
from kvcore.coordinator import KVCacheCoordinator
from kvcore.managers.base import HitBlocks
from tests.kvcore.snapshots import holder_counts, table_slots
from tests.kvcore.steps import BLOCK_SIZE, run_step, tokens

FULL_AND_SLIDING = (FullAttentionSpec(BLOCK_SIZE), SlidingWindowSpec(BLOCK_SIZE, sliding_window=8))


def make_hybrid(num_blocks: int) -> KVCacheManager:
    """Group 0 is full attention, group 1 a sliding window of 8 tokens, both of block size 4."""
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, groups=FULL_AND_SLIDING))


def test_groups_allocate_from_one_pool_in_group_order_and_free_group_by_group() -> None:
    """Group 0 takes its blocks before group 1, and freeing queues group 0's table (tail first) before group 1's."""
    manager = make_hybrid(num_blocks=10)
    run_step(manager, Request("a", tokens(0, 12), BLOCK_SIZE))
    assert manager.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])
    manager.free("a")
    assert manager.free_block_ids() == [7, 8, 9, 3, 2, 1, 6, 5, 4]
    manager.check_invariants()


def test_hybrid_hit_is_the_longest_prefix_every_group_accepts() -> None:
    """Full attention hits 3 blocks and the window group (needing 2 blocks before the boundary) agrees: 12 tokens."""
    manager = make_hybrid(num_blocks=10)
    run_step(manager, Request("a", tokens(0, 12), BLOCK_SIZE))
    manager.free("a")
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 13), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1, 2, 3], [0, 5, 6])
    assert hit_len_tokens == 12


def test_hybrid_hit_shrinks_when_the_window_groups_needed_blocks_are_evicted() -> None:
    """Evicting the window group's last hit block leaves it a hit of 8 tokens, and full attention is trimmed to it."""
    manager = make_hybrid(num_blocks=10)
    run_step(manager, Request("a", tokens(0, 12), BLOCK_SIZE))
    manager.free("a")
    manager.evict_blocks([6])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 13), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1, 2], [4, 5])
    assert hit_len_tokens == 8


def test_hybrid_hit_shrinks_to_the_full_attention_hit_when_that_is_shorter() -> None:
    """Evicting full attention's second block caps the hit at 4 tokens, and the window group keeps only block 0."""
    manager = make_hybrid(num_blocks=10)
    run_step(manager, Request("a", tokens(0, 12), BLOCK_SIZE))
    manager.free("a")
    manager.evict_blocks([2])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 13), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1], [4])
    assert hit_len_tokens == 4


def test_two_groups_of_one_spec_hit_only_where_both_are_cached() -> None:
    """Two full-attention groups are looked up together: one group's eviction ends the hit for both."""
    manager = KVCacheManager(
        KVCacheConfig(num_blocks=10, groups=(FullAttentionSpec(BLOCK_SIZE), FullAttentionSpec(BLOCK_SIZE)))
    )
    run_step(manager, Request("a", tokens(0, 12), BLOCK_SIZE))
    assert manager.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])
    manager.free("a")
    manager.evict_blocks([5])
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("b", tokens(0, 13), BLOCK_SIZE))
    assert hit_block_ids(hit_blocks) == ([1], [4])
    assert hit_len_tokens == 4


# -- cross-group double allocation (vLLM #33775) ---------------------------------------------


def allocate_new_computed_blocks_interleaved_per_group(coordinator: KVCacheCoordinator) -> Callable[..., None]:
    """The buggy order this test guards against: each group takes its local hit, then its external blocks.

    Group 0's external allocation pops the head of the free queue before group
    1 has touched its hit, so it can take group 1's hit block.
    """

    def interleaved(
        request_id: str,
        new_computed_blocks: HitBlocks,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        skip_zeroing_group_ids: Sequence[int] = (),
    ) -> None:
        for manager, hit in zip(coordinator.managers, new_computed_blocks):
            manager.add_local_computed_blocks(request_id, hit, num_local_computed_tokens, num_external_computed_tokens)
            if num_external_computed_tokens > 0:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    return interleaved


def admit_with_local_hit_and_external_tokens(manager: KVCacheManager) -> None:
    """Build the pool whose free-queue head is group 1's ref-0 hit block, then admit a request with external tokens.

    Request a (20 tokens) computes 16, so its window group frees blocks 5 and 6
    (cached, to the tail) before the pool runs dry, then finishes.  Request b
    shares a's first 8 tokens: a hit of [1, 2] and [5, 6], with block 6 at the
    head of the queue.  An external connector supplies b's next 4 tokens.
    """
    request_a = Request("a", tokens(0, 20), BLOCK_SIZE)
    run_step(manager, request_a, 16)
    assert manager.get_block_ids("a") == ([1, 2, 3, 4], [5, 6, 7, 8])
    run_step(manager, request_a, 4)
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 9], [0, 0, 7, 8, 10])
    manager.free(request_a)
    assert manager.free_block_ids() == [6, 5, 9, 4, 3, 2, 1, 10, 8, 7]

    request_b = Request("b", [*tokens(0, 8), *tokens(500, 5)], BLOCK_SIZE)
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(request_b)
    assert hit_block_ids(hit_blocks) == ([1, 2], [5, 6])
    assert hit_len_tokens == 8
    assert manager.free_block_ids()[0] == 6, "the head of the queue is group 1's ref-0 hit block"
    assert manager.ref_counts()[6] == 0
    new_blocks = manager.allocate_slots(
        request_b,
        num_new_tokens=1,
        num_new_computed_tokens=8,
        new_computed_blocks=hit_blocks,
        num_external_computed_tokens=4,
    )
    assert new_blocks is not None


def test_local_hit_with_external_tokens_never_puts_one_block_in_two_places() -> None:
    """Taking every group's local hit before any external allocation keeps group 1's hit block out of group 0."""
    manager = make_hybrid(num_blocks=11)
    admit_with_local_hit_and_external_tokens(manager)
    # Group 1 skips block 5 (outside the window of 12 computed tokens), so group 0 may reuse it for external tokens.
    assert manager.get_block_ids("b") == ([1, 2, 5, 4], [0, 6, 9, 3])
    assert manager.free_block_ids() == [10, 8, 7]
    slots = table_slots(manager)
    for block_id, holders in slots.items():
        assert len(holders) == 1, f"block {block_id} is in {len(holders)} table slots: {holders}"
    assert manager.ref_counts() == holder_counts(manager)
    manager.check_invariants()


def test_interleaving_local_hits_and_external_allocation_per_group_would_double_allocate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the per-group interleaved order, group 0's external block is group 1's hit block 6: the scenario bites."""
    manager = make_hybrid(num_blocks=11)
    coordinator = manager.coordinator
    monkeypatch.setattr(
        coordinator, "allocate_new_computed_blocks", allocate_new_computed_blocks_interleaved_per_group(coordinator)
    )
    admit_with_local_hit_and_external_tokens(manager)
    assert manager.get_block_ids("b") == ([1, 2, 6, 9], [0, 6, 5, 4])
    assert table_slots(manager)[6] == [("b", 0, 2), ("b", 1, 1)]
    # Ref counts still match holders, so only the slot check above sees the bug.
    assert manager.ref_counts() == holder_counts(manager)
    assert manager.free_block_ids() == [3, 10, 8, 7], "one block too many is left free"
