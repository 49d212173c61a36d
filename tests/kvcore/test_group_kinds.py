"""R-SWA, ring-buffer and cross-attention groups beside full attention."""

from __future__ import annotations

import pytest

from kvcore import (
    AttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    InvalidConfig,
    KVCacheConfig,
    KVCacheManager,
    Request,
    RSWASpec,
    hit_block_ids,
)

BLOCK_SIZE = 2


def make_manager(*specs: AttentionSpec, num_blocks: int = 12, enable_caching: bool = True) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, groups=specs, enable_caching=enable_caching))


def prefill(manager: KVCacheManager, request: Request, num_encoder_tokens: int = 0) -> int:
    """Schedule the whole prompt from waiting, taking the local hit; returns the hit length."""
    hit, hit_length = manager.get_computed_blocks(request)
    new_blocks = manager.allocate_slots(
        request, request.num_tokens - hit_length, hit_length, hit, num_encoder_tokens=num_encoder_tokens
    )
    assert new_blocks is not None
    request.num_computed_tokens = request.num_tokens
    return hit_length


def decode(manager: KVCacheManager, request: Request, num_steps: int) -> None:
    """``num_steps`` one-token steps: each samples a token, then computes it."""
    for _ in range(num_steps):
        request.append_output_token_ids(9)
        assert manager.allocate_slots(request, 1) is not None
        request.num_computed_tokens = request.num_tokens


def test_rswa_frees_the_gap_between_the_prompt_and_the_window() -> None:
    """A 5-token prompt fills blocks 0-2; with an R-SWA window of 2, after 10 tokens block 3 (tokens 6-7) is freed.

    The prompt's last block (tokens 4-5, half prompt) is kept: every token
    attends to the whole prompt."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), RSWASpec(BLOCK_SIZE, rswa_window=2))
    request = Request("r", [1, 2, 3, 4, 5], BLOCK_SIZE)
    prefill(manager, request)
    decode(manager, request, 6)
    assert manager.get_block_ids("r") == ([1, 2, 3, 7, 9, 11], [4, 5, 6, 0, 10, 8])
    manager.check_invariants()
    # A full-attention hit: the freed gap block was reused since, so the hit ends before it.
    other = Request("s", [1, 2, 3, 4, 5, 9, 9, 9, 9], BLOCK_SIZE)
    hit, hit_length = manager.get_computed_blocks(other)
    assert (hit_block_ids(hit), hit_length) == (([1, 2, 3], [4, 5, 6]), 6)


def test_rswa_alone_frees_nothing_inside_the_prompt() -> None:
    """A block-aligned 6-token prompt with window 1: the gap opens once 9 tokens are processed.

    At 8 processed tokens the window starts at token 7, inside block 3: nothing
    is freed.  At 9 it starts at token 8, and block 3 (tokens 6-7) is freed."""
    manager = make_manager(RSWASpec(BLOCK_SIZE, rswa_window=1))
    request = Request("r", [1, 2, 3, 4, 5, 6], BLOCK_SIZE)
    prefill(manager, request)
    decode(manager, request, 3)
    assert manager.get_block_ids("r") == ([1, 2, 3, 4, 5],)
    decode(manager, request, 1)
    assert manager.get_block_ids("r") == ([1, 2, 3, 0, 5],)
    manager.check_invariants()


def test_ring_buffer_holds_one_block_and_takes_no_hit() -> None:
    """A ring group claims one block at the first allocation and never more; it caches nothing."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), CircularBufferSpec(BLOCK_SIZE))
    request = Request("r", [1, 2, 3, 4, 5], BLOCK_SIZE)
    prefill(manager, request)
    decode(manager, request, 6)
    assert manager.get_block_ids("r") == ([1, 2, 3, 5, 6, 7], [4])
    assert {entry[0][1] for entry in manager.cache_entries()} == {0}
    other = Request("s", [1, 2, 3, 4, 5, 6, 7], BLOCK_SIZE)
    hit, hit_length = manager.get_computed_blocks(other)
    assert (hit_block_ids(hit), hit_length) == (([1, 2], []), 4)
    prefill(manager, other)
    assert manager.get_block_ids("s") == ([1, 2, 8, 9], [10])
    manager.free("r")
    # Freed uncached, the ring block goes to the head of the queue.
    assert manager.free_block_ids()[0] == 4
    manager.check_invariants()


def test_cross_attention_gets_the_encoder_blocks_once() -> None:
    """Three encoder tokens take two blocks when the request is scheduled from waiting; decode steps add none."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), CrossAttentionSpec(BLOCK_SIZE), enable_caching=False)
    request = Request("r", [1, 2, 3, 4, 5], BLOCK_SIZE)
    prefill(manager, request, num_encoder_tokens=3)
    decode(manager, request, 6)
    assert manager.get_block_ids("r") == ([1, 2, 3, 6, 7, 8], [4, 5])
    manager.free("r")
    # Each table is freed tail first, group 0 first; uncached, each block goes to the head of the queue.
    assert manager.free_block_ids()[:8] == [5, 4, 8, 7, 6, 3, 2, 1]


def test_cross_attention_blocks_count_in_admission() -> None:
    """With 4 usable blocks, a 3-token prompt (2 blocks) and 5 encoder tokens (3 blocks) do not fit."""
    manager = make_manager(
        FullAttentionSpec(BLOCK_SIZE), CrossAttentionSpec(BLOCK_SIZE), num_blocks=5, enable_caching=False
    )
    request = Request("r", [1, 2, 3], BLOCK_SIZE)
    assert manager.allocate_slots(request, 3, num_encoder_tokens=5) is None
    assert manager.free_block_ids() == [1, 2, 3, 4]
    assert manager.allocate_slots(request, 3, num_encoder_tokens=4) is not None
    assert manager.get_block_ids("r") == ([1, 2], [3, 4])


@pytest.mark.parametrize(
    ("specs", "enable_caching", "field"),
    [
        ((FullAttentionSpec(BLOCK_SIZE), CrossAttentionSpec(BLOCK_SIZE)), True, "enable_caching"),
        ((CircularBufferSpec(BLOCK_SIZE), CircularBufferSpec(BLOCK_SIZE)), True, "groups"),
    ],
)
def test_configs_vllm_cannot_run_are_refused_by_field(
    specs: tuple[AttentionSpec, ...], enable_caching: bool, field: str
) -> None:
    with pytest.raises(InvalidConfig) as raised:
        KVCacheConfig(num_blocks=8, groups=specs, enable_caching=enable_caching)
    assert raised.value.field == field


def test_rswa_window_must_be_positive() -> None:
    with pytest.raises(InvalidConfig) as raised:
        RSWASpec(BLOCK_SIZE, rswa_window=0)
    assert raised.value.field == "rswa_window"
