"""Mamba state groups (vLLM's ``none`` cache mode), MLA and sliding-window MLA groups beside full attention.

The expected tables are the ones vLLM 0.33.0 produces for the same steps.
"""

from __future__ import annotations

import pytest

from kvcore import (
    AttentionSpec,
    FullAttentionSpec,
    InvalidConfig,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    hit_block_ids,
)

BLOCK_SIZE = 2


def make_manager(*specs: AttentionSpec, num_blocks: int = 20, enable_caching: bool = False) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, groups=specs, enable_caching=enable_caching))


def step(manager: KVCacheManager, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0) -> bool:
    """Schedule ``num_new_tokens`` and compute them; False when the step is refused."""
    if manager.allocate_slots(request, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens) is None:
        return False
    request.num_computed_tokens += num_new_tokens
    return True


def test_mamba_keeps_the_last_state_block_and_its_speculative_block() -> None:
    """A 5-token prompt takes 3 slot blocks and 1 speculative block; decoding frees every block before
    the one holding the last computed token, and the speculative block keeps moving past the slots."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), MambaSpec(BLOCK_SIZE, num_speculative_blocks=1))
    request = Request("r", [1, 2, 3, 4, 5], BLOCK_SIZE)
    assert step(manager, request, 5)
    assert manager.get_block_ids("r") == ([1, 2, 3], [4, 5, 6, 7])
    tables = []
    for _ in range(3):
        request.append_output_token_ids(9)
        assert step(manager, request, 1)
        tables.append(manager.get_block_ids("r"))
    assert tables == [
        ([1, 2, 3], [0, 0, 6, 7]),
        ([1, 2, 3, 5], [0, 0, 6, 7, 4]),
        ([1, 2, 3, 5], [0, 0, 0, 7, 4]),
    ]
    manager.check_invariants()
    manager.free(request)
    # Group 0's table, then group 1's, each tail first; the Mamba blocks freed while decoding came first.
    assert manager.block_pool.free_block_ids()[:7] == [4, 7, 5, 3, 2, 1, 6]


def test_mamba_speculative_blocks_count_in_admission() -> None:
    """With 2 speculative blocks and 2 lookahead tokens, a 3-token prompt takes 5 of 9 blocks; a
    7-token prompt then needs 6 (4 for its slots, 2 speculative) and is refused."""
    manager = make_manager(MambaSpec(BLOCK_SIZE, num_speculative_blocks=2), num_blocks=10)
    request = Request("r", [1, 2, 3], BLOCK_SIZE)
    assert step(manager, request, 3, num_lookahead_tokens=2)
    assert manager.get_block_ids("r") == ([1, 2, 3, 4, 5],)
    request.append_output_token_ids(9)
    assert step(manager, request, 1, num_lookahead_tokens=2)
    assert manager.get_block_ids("r") == ([0, 2, 3, 4, 5],)
    request.append_output_token_ids(9)
    assert step(manager, request, 1, num_lookahead_tokens=2)
    assert manager.get_block_ids("r") == ([0, 2, 3, 4, 5, 1],)
    other = Request("q", [1, 2, 3, 4, 5, 6, 7], BLOCK_SIZE)
    assert manager.allocate_slots(other, 7) is None
    assert manager.get_block_ids("q") == ([],)
    assert manager.block_pool.num_free_blocks == 4
    manager.check_invariants()


def test_mamba_refuses_prefix_caching() -> None:
    """vLLM 0.33.0 caches Mamba state only in its align mode and asserts otherwise."""
    with pytest.raises(InvalidConfig) as raised:
        make_manager(FullAttentionSpec(BLOCK_SIZE), MambaSpec(BLOCK_SIZE), enable_caching=True)
    assert raised.value.field == "enable_caching"
    assert "groups[1] is Mamba" in str(raised.value)


def test_mamba_speculative_blocks_must_not_be_negative() -> None:
    with pytest.raises(InvalidConfig) as raised:
        MambaSpec(BLOCK_SIZE, num_speculative_blocks=-1)
    assert (raised.value.field, raised.value.value) == ("num_speculative_blocks", -1)


def test_mla_is_full_attention_looked_up_as_a_group_of_its_own() -> None:
    """Full attention and MLA each keep and hit every block; a hit ends at the last block both hold."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), MLAAttentionSpec(BLOCK_SIZE), enable_caching=True)
    assert len(manager.coordinator.spec_groups) == 2
    request = Request("r", [1, 2, 3, 4, 5], BLOCK_SIZE)
    assert step(manager, request, 5)
    assert manager.get_block_ids("r") == ([1, 2, 3], [4, 5, 6])
    manager.free(request)
    hit, hit_length = manager.get_computed_blocks(Request("s", [1, 2, 3, 4, 5, 6], BLOCK_SIZE))
    assert (hit_block_ids(hit), hit_length) == (([1, 2], [4, 5]), 4)


def test_sliding_window_mla_is_a_sliding_window_looked_up_as_a_group_of_its_own() -> None:
    """Plain and MLA sliding windows of 3 tokens free the same positions and hit alike, each in a spec
    group of its own."""
    manager = make_manager(
        FullAttentionSpec(BLOCK_SIZE),
        SlidingWindowSpec(BLOCK_SIZE, 3),
        SlidingWindowMLASpec(BLOCK_SIZE, 3),
        num_blocks=24,
        enable_caching=True,
    )
    assert len(manager.coordinator.spec_groups) == 3
    request = Request("r", [1, 2, 3, 4, 5, 6, 7], BLOCK_SIZE)
    assert step(manager, request, 7)
    assert manager.get_block_ids("r") == ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    for _ in range(2):
        request.append_output_token_ids(9)
        assert step(manager, request, 1)
    assert manager.get_block_ids("r") == ([1, 2, 3, 4, 13], [0, 0, 0, 8, 14], [0, 0, 0, 12, 15])
    manager.free(request)
    hit, hit_length = manager.get_computed_blocks(Request("s", [1, 2, 3, 4, 5, 6, 7, 9, 9, 1], BLOCK_SIZE))
    assert (hit_block_ids(hit), hit_length) == (([1, 2, 3, 4], [0, 0, 0, 8], [0, 0, 0, 12]), 8)
