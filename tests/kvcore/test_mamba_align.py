"""Mamba state groups in vLLM's ``align`` cache mode, beside full attention and alone.

The expected tables, hits and free queues are the ones vLLM 0.33.0 produces
for the same steps.
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
    Request,
    SlidingWindowSpec,
)

BLOCK_SIZE = 2
ALIGNED = MambaSpec(BLOCK_SIZE, cache_mode="align")


def make_manager(*specs: AttentionSpec, num_blocks: int = 16) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, groups=specs))


def step(
    manager: KVCacheManager, request: Request, num_new_tokens: int | None = None, num_lookahead_tokens: int = 0
) -> int | None:
    """One scheduler step: a request holding no blocks takes its hit first; ``None`` computes every
    remaining token.  Returns the hit length, or ``None`` when the step is refused."""
    hit_blocks, hit_length = None, 0
    if not manager.get_blocks(request.request_id)[0]:
        hit_blocks, hit_length = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - request.num_computed_tokens - hit_length
    blocks = manager.allocate_slots(
        request, num_new_tokens, hit_length, hit_blocks, num_lookahead_tokens=num_lookahead_tokens
    )
    if blocks is None:
        return None
    request.num_computed_tokens += hit_length + num_new_tokens
    manager.new_step_starts()
    return hit_length


def decode(manager: KVCacheManager, request: Request, token: int) -> None:
    request.append_output_token_ids(token)
    assert step(manager, request, 1) == 0


def test_states_sit_on_block_boundaries_with_null_padding_between() -> None:
    """An 8-token chunk puts its state in the block of its last token, after three null blocks; every
    step that reaches a new block gets one there and frees the state before the one it copies from."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), ALIGNED)
    request = Request("a", list(range(9)), BLOCK_SIZE)
    assert step(manager, request, 8) == 0
    assert manager.get_block_ids("a") == ([1, 2, 3, 4], [0, 0, 0, 5])
    tables = []
    for token in (50, 51, 52):
        assert step(manager, request, 1) == 0
        tables.append(manager.get_block_ids("a"))
        request.append_output_token_ids(token)
    assert tables == [
        ([1, 2, 3, 4, 6], [0, 0, 0, 5, 7]),
        ([1, 2, 3, 4, 6], [0, 0, 0, 0, 7]),
        ([1, 2, 3, 4, 6, 8], [0, 0, 0, 0, 7, 9]),
    ]
    manager.check_invariants()


def test_a_freed_request_returns_states_then_table_tail_first() -> None:
    """The free queue after the decode above: the states freed while decoding, then group 0's table
    tail first, then group 1's last state."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), ALIGNED)
    request = Request("a", list(range(9)), BLOCK_SIZE)
    assert step(manager, request, 8) == 0
    for token in (50, 51, 52):
        assert step(manager, request, 1) == 0
        request.append_output_token_ids(token)
    assert step(manager, request, 1) == 0
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 6, 8], [0, 0, 0, 0, 0, 9])
    manager.free(request)
    assert manager.block_pool.free_block_ids()[:12] == [10, 11, 12, 13, 14, 15, 5, 7, 8, 6, 4, 3]


def test_a_hit_takes_the_latest_cached_state_searching_right_to_left() -> None:
    """States at 4 and 6 tokens are cached (the one at 2 never existed): a request sharing 6 tokens
    hits all 6, its Mamba table the state block after two null blocks."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), ALIGNED)
    first = Request("a", list(range(5)), BLOCK_SIZE)
    assert step(manager, first, 4) == 0
    assert manager.get_block_ids("a") == ([1, 2], [0, 3])
    for token in (50, 51):
        assert step(manager, first, 1) == 0
        first.append_output_token_ids(token)
    assert step(manager, first, 1) == 0
    assert manager.get_block_ids("a") == ([1, 2, 4, 6], [0, 0, 5, 7])
    manager.free(first)
    second = Request("b", [*range(5), 50, 51, 7, 7], BLOCK_SIZE)
    assert step(manager, second) == 6
    assert manager.get_block_ids("b") == ([1, 2, 4, 7, 6], [0, 0, 5, 0, 8])
    manager.check_invariants()


def test_a_state_cached_in_this_step_is_hit_only_in_the_next() -> None:
    """A request hitting a state another request cached in the same scheduler step is refused (its
    count is the pool plus one), and admitted once the next step starts."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), ALIGNED)
    first = Request("a", list(range(5)), BLOCK_SIZE)
    assert manager.allocate_slots(first, 4) is not None
    first.num_computed_tokens = 4
    second = Request("b", list(range(5)), BLOCK_SIZE)
    hit_blocks, hit_length = manager.get_computed_blocks(second)
    assert hit_length == 4
    assert manager.allocate_slots(second, 1, hit_length, hit_blocks) is None
    manager.new_step_starts()
    assert step(manager, second) == 4
    assert manager.get_block_ids("b") == ([1, 2, 4], [0, 3, 5])


def test_the_prompt_state_is_cached_again_after_its_key_is_evicted() -> None:
    """Evicting a held state's key (and a full-attention block's) drops both entries; the next step
    caching up to the prompt's last hash boundary enters the state again, not the attention block."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), ALIGNED)
    request = Request("a", list(range(9)), BLOCK_SIZE)
    assert step(manager, request, 8) == 0
    assert manager.get_block_ids("a") == ([1, 2, 3, 4], [0, 0, 0, 5])
    manager.evict_blocks([3, 5])
    assert sorted(block for _, block in manager.cache_entries()) == [1, 2, 4]
    assert step(manager, request, 1) == 0
    assert sorted(block for _, block in manager.cache_entries()) == [1, 2, 4, 5]


def test_states_take_no_slot_for_a_drafter_lookahead() -> None:
    """Lookahead slots grow full attention's table, not the Mamba group's (a drafter has no Mamba
    layers)."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), ALIGNED)
    request = Request("a", list(range(9)), BLOCK_SIZE)
    assert step(manager, request, 8, num_lookahead_tokens=3) == 0
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [0, 0, 0, 7])
    assert step(manager, request, 1, num_lookahead_tokens=3) == 0
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [0, 0, 0, 7, 8])


def test_a_pure_mamba_model_hits_its_last_state() -> None:
    """One align-mode group: chunks of 6 and 2 tokens, then the last prompt token; a resend hits 8."""
    manager = make_manager(ALIGNED, num_blocks=12)
    request = Request("a", list(range(9)), BLOCK_SIZE)
    assert step(manager, request, 6) == 0
    assert manager.get_block_ids("a") == ([0, 0, 1],)
    assert step(manager, request, 2) == 0
    assert manager.get_block_ids("a") == ([0, 0, 1, 2],)
    assert step(manager, request, 1) == 0
    assert manager.get_block_ids("a") == ([0, 0, 0, 2, 3],)
    manager.free(request)
    resend = Request("b", list(range(9)), BLOCK_SIZE)
    assert step(manager, resend) == 8
    assert manager.get_block_ids("b") == ([0, 0, 0, 2, 3],)


def test_speculative_blocks_follow_the_last_state_and_move_to_the_end_when_passed() -> None:
    """With 2 speculative blocks: the first 4-token chunk takes its state and both; the next 8-token
    chunk's state position (5) passes them, so they move, whole, to the table's end (block 4 becomes
    the new state's block) and one new block follows.  A resend hits the 12-token state."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), MambaSpec(BLOCK_SIZE, 2, cache_mode="align"), num_blocks=24)
    request = Request("a", list(range(13)), BLOCK_SIZE)
    assert step(manager, request, 4) == 0
    assert manager.get_block_ids("a") == ([1, 2], [0, 3, 4, 5])
    assert step(manager, request, 8) == 0
    assert manager.get_block_ids("a") == ([1, 2, 6, 7, 8, 9], [0, 3, 0, 0, 0, 4, 5, 10])
    assert step(manager, request, 1) == 0
    assert manager.get_block_ids("a") == ([1, 2, 6, 7, 8, 9, 11], [0, 0, 0, 0, 0, 4, 5, 10, 12])
    manager.check_invariants()
    manager.free(request)
    resend = Request("b", list(range(13)), BLOCK_SIZE)
    assert step(manager, resend) == 12
    assert manager.get_block_ids("b")[1][:6] == [0, 0, 0, 0, 0, 4]


def test_speculative_blocks_count_on_a_requests_first_allocation_only() -> None:
    """With 1 speculative block, an 8-token chunk takes 4 full-attention blocks and 2 for Mamba (its
    state and the speculative block): 6 of 8, leaving 2.  A second request's chunk, counted alike, is
    refused; the first request's next step, which needs a full-attention block and one state (the
    speculative block counted no more), takes the last 2."""
    manager = make_manager(FullAttentionSpec(BLOCK_SIZE), MambaSpec(BLOCK_SIZE, 1, cache_mode="align"), num_blocks=9)
    first = Request("a", list(range(9)), BLOCK_SIZE)
    assert step(manager, first, 8) == 0
    assert manager.get_block_ids("a") == ([1, 2, 3, 4], [0, 0, 0, 5, 6])
    assert step(manager, Request("b", list(range(20, 29)), BLOCK_SIZE), 8) is None
    assert step(manager, first, 1) == 0
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 7], [0, 0, 0, 5, 6, 8])
    assert manager.block_pool.num_free_blocks == 0


@pytest.mark.parametrize(
    ("config", "field"),
    [
        # Under decode context parallelism with caching, a sharded group beside the states must be full attention.
        (lambda: KVCacheConfig(8, [SlidingWindowSpec(2, 3), ALIGNED], dcp_world_size=2), "dcp_world_size"),
        (
            lambda: KVCacheConfig(8, [FullAttentionSpec(2), ALIGNED], prefix_cache_retention_interval=3),
            "prefix_cache_retention_interval",
        ),
        (
            lambda: KVCacheConfig(
                8,
                [FullAttentionSpec(2), MambaSpec(4, cache_mode="align")],
                use_eagle=True,
                num_prefill_lookahead=2,
            ),
            "num_prefill_lookahead",
        ),
        (lambda: KVCacheConfig(8, [MambaSpec(2)]), "enable_caching"),
        (lambda: MambaSpec(2, cache_mode="all"), "cache_mode"),
    ],
)
def test_what_the_align_mode_does_not_take_is_refused_by_field(config: object, field: str) -> None:
    """vLLM 0.33.0's refusals, and what kvcore does not implement of the align mode, name the field."""
    with pytest.raises(InvalidConfig) as caught:
        config()  # type: ignore[operator]
    assert caught.value.field == field


def test_the_hash_block_size_defaults_to_the_groups_gcd_beside_an_aligned_mamba_group() -> None:
    """Outside the align mode a Mamba group makes hashes back off to the scheduler block size; in it,
    the prefix cache hashes at the groups' greatest common divisor."""
    assert KVCacheConfig(8, [FullAttentionSpec(4), MambaSpec(2, cache_mode="align")]).hash_block_size == 2
    assert KVCacheConfig(8, [FullAttentionSpec(4), MambaSpec(2)], enable_caching=False).hash_block_size == 4
