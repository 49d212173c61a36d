"""Blocks recorded for the worker to zero (vLLM 0.33.0's ``take_new_block_ids``).

A cache with a Mamba group, or with attention groups of different KV cache dtypes, zeroes every new
attention block before the step that writes it: the allocator records each block an attention group
takes from the pool (not a ring buffer's, not a Mamba state's), and the scheduler drains the record
every step.  ``tests/vllm/test_vllm_zeroing.py`` checks the same steps against vLLM's manager.
"""

from __future__ import annotations

import pytest

from kvcore import (
    CircularBufferSpec,
    FullAttentionSpec,
    InvalidArgument,
    InvalidConfig,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)

MIXED = (FullAttentionSpec(2), SlidingWindowSpec(2, 4), CircularBufferSpec(2))
"""Full attention and a sliding window in fp8 beside a ring buffer: two KV cache dtypes."""


def mixed_manager(num_blocks: int = 16, enable_caching: bool = True) -> KVCacheManager:
    config = KVCacheConfig(num_blocks, MIXED, enable_caching=enable_caching, kv_cache_dtypes=("auto", "fp8", "auto"))
    assert config.needs_zeroing
    return KVCacheManager(config)


def test_zeroing_is_needed_with_a_mamba_group_or_two_kv_cache_dtypes() -> None:
    """As vLLM's ``needs_kv_cache_zeroing``: a Mamba group, or attention groups of two dtypes."""
    assert not KVCacheConfig(8, [FullAttentionSpec(2), SlidingWindowSpec(2, 4)]).needs_zeroing
    same = KVCacheConfig(8, [FullAttentionSpec(2), SlidingWindowSpec(2, 4)], kv_cache_dtypes=("fp8", "fp8"))
    assert not same.needs_zeroing
    assert KVCacheConfig(8, [FullAttentionSpec(2), MambaSpec(2)], enable_caching=False).needs_zeroing
    assert KVCacheConfig(8, MIXED, kv_cache_dtypes=("auto", "fp8", "auto")).needs_zeroing
    # A Mamba group's dtype is not a KV cache dtype: only the attention groups' count.
    states = KVCacheConfig(8, [FullAttentionSpec(2), MambaSpec(2)], enable_caching=False, kv_cache_dtypes=("a", "b"))
    assert states.needs_zeroing


@pytest.mark.parametrize(
    ("dtypes", "field"),
    [(("auto",), "kv_cache_dtypes"), (("auto", ""), "kv_cache_dtypes[1]"), (("auto", 8), "kv_cache_dtypes[1]")],
    ids=["one dtype for two groups", "an empty name", "not a name"],
)
def test_kv_cache_dtypes_are_one_name_per_group(dtypes: tuple[object, ...], field: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        KVCacheConfig(8, [FullAttentionSpec(2), SlidingWindowSpec(2, 4)], kv_cache_dtypes=dtypes)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_new_attention_blocks_are_recorded_group_by_group_and_drained() -> None:
    """A 5-token step takes 3 blocks for full attention, 3 for the window and the ring's one block:
    the attention groups' six are recorded, group by group, and the record is empty once taken."""
    manager = mixed_manager()
    request = Request("r", [1, 2, 3, 4, 5], 2)
    new_blocks = manager.allocate_slots(request, 5)
    assert new_blocks is not None
    full, window, ring = ([block.block_id for block in group] for group in new_blocks)
    assert manager.take_new_block_ids() == full + window
    assert ring and not set(ring) & set(full + window)
    assert manager.take_new_block_ids() == []
    request.num_computed_tokens = 5
    # The next step reaches a fourth block of each attention group.
    grown = manager.allocate_slots(request, 2)
    assert grown is not None
    assert manager.take_new_block_ids() == [grown[0][0].block_id, grown[1][0].block_id]


def test_a_hit_is_not_recorded_only_the_blocks_after_it() -> None:
    """A request hitting another's cached prefix zeroes none of the hit's blocks."""
    manager = mixed_manager()
    first = Request("a", [1, 2, 3, 4, 5], 2)
    assert manager.allocate_slots(first, 5) is not None
    first.num_computed_tokens = 5
    manager.take_new_block_ids()
    second = Request("b", [1, 2, 3, 4, 9, 9], 2)
    hit_blocks, hit_length = manager.get_computed_blocks(second)
    assert hit_length == 4
    new_blocks = manager.allocate_slots(second, 2, hit_length, hit_blocks)
    assert new_blocks is not None
    zeroed = manager.take_new_block_ids()
    assert zeroed == [new_blocks[0][0].block_id, new_blocks[1][0].block_id]
    hit_ids = {block.block_id for group in hit_blocks for block in group}
    assert not hit_ids & set(zeroed)


@pytest.mark.parametrize("load_lands_later", [False, True], ids=["synchronous load", "asynchronous load"])
def test_an_asynchronous_loads_blocks_are_left_out(load_lands_later: bool) -> None:
    """External tokens' blocks are zeroed unless the load lands after the step (it would race the
    zeroing): ``skip_zeroing_group_ids`` names the groups such a load writes."""
    manager = mixed_manager(enable_caching=False)
    request = Request("r", [1, 2, 3, 4, 5, 6, 7], 2)
    skip = (0, 1) if load_lands_later else ()
    new_blocks = manager.allocate_slots(
        request,
        0 if load_lands_later else 1,
        num_external_computed_tokens=4,
        delay_cache_blocks=load_lands_later,
        skip_zeroing_group_ids=skip,
    )
    assert new_blocks is not None
    full, window, _ = manager.get_block_ids("r")
    zeroed = manager.take_new_block_ids()
    if load_lands_later:
        assert zeroed == []
    else:
        # Group by group: the loaded blocks, then the block of the step's own token.
        assert zeroed == [*full, *window] and len(full) == len(window) == 3


def test_a_refused_allocation_records_nothing() -> None:
    manager = mixed_manager(num_blocks=4)
    assert manager.allocate_slots(Request("r", list(range(1, 9)), 2), 8) is None
    assert manager.take_new_block_ids() == []


def test_skip_zeroing_group_ids_naming_no_group_is_refused_and_changes_nothing() -> None:
    manager = mixed_manager()
    request = Request("r", [1, 2, 3], 2)
    free_before = manager.free_block_ids()
    with pytest.raises(InvalidArgument) as caught:
        manager.allocate_slots(request, 3, skip_zeroing_group_ids=(3,))
    assert caught.value.name == "skip_zeroing_group_ids"
    assert manager.free_block_ids() == free_before and manager.take_new_block_ids() == []


def test_a_cache_of_one_dtype_records_nothing() -> None:
    manager = KVCacheManager(KVCacheConfig(8, [FullAttentionSpec(2), SlidingWindowSpec(2, 4)]))
    assert manager.allocate_slots(Request("r", [1, 2, 3], 2), 3) is not None
    assert manager.take_new_block_ids() == []


def test_mamba_states_are_not_recorded_but_the_attention_blocks_beside_them_are() -> None:
    manager = KVCacheManager(KVCacheConfig(8, [FullAttentionSpec(2), MambaSpec(2)], enable_caching=False))
    new_blocks = manager.allocate_slots(Request("r", [1, 2, 3], 2), 3)
    assert new_blocks is not None
    assert manager.take_new_block_ids() == [block.block_id for block in new_blocks[0]]
    assert new_blocks[1]


def test_groups_of_one_kind_and_two_dtypes_are_looked_up_apart() -> None:
    """Two sliding windows that differ only in dtype are two specs (vLLM compares specs with their
    dtype): each is a spec group of its own in the hybrid lookup."""
    windows = [SlidingWindowSpec(2, 4), SlidingWindowSpec(2, 4)]
    apart = KVCacheManager(KVCacheConfig(8, windows, kv_cache_dtypes=("auto", "fp8")))
    together = KVCacheManager(KVCacheConfig(8, windows))
    assert [g.group_ids for g in apart.coordinator.spec_groups] == [[0], [1]]
    assert [g.group_ids for g in together.coordinator.spec_groups] == [[0, 1]]
