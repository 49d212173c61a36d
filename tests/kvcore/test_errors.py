"""Typed errors: each names the bad field or value, and an operation that raises leaves the allocator as it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvcore import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    InvalidArgument,
    InvalidConfig,
    KVCacheConfig,
    KVCacheManager,
    KVCoreError,
    RefCountUnderflow,
    Request,
    RequestTooLong,
    SlidingWindowSpec,
    UnknownBlock,
)
from tests.kvcore.snapshots import snapshot
from tests.kvcore.steps import BLOCK_SIZE, run_step, tokens


def busy_manager(max_model_len: int | None = None) -> KVCacheManager:
    """A manager with a running request "run" (blocks 3, 4) and a finished one whose blocks 1, 2 are cached and free."""
    manager = KVCacheManager(
        KVCacheConfig(num_blocks=8, groups=(FullAttentionSpec(BLOCK_SIZE),), max_model_len=max_model_len)
    )
    run_step(manager, Request("done", tokens(0, 8), BLOCK_SIZE))
    manager.free("done")
    run_step(manager, Request("run", tokens(100, 6), BLOCK_SIZE))
    assert manager.get_block_ids("run") == ([3, 4],)
    assert manager.free_block_ids() == [5, 6, 7, 2, 1]
    return manager


@pytest.mark.parametrize(
    ("make_config", "field", "value"),
    [
        (lambda: KVCacheConfig(num_blocks=1, groups=(FullAttentionSpec(4),)), "num_blocks", 1),
        (lambda: KVCacheConfig(num_blocks=True, groups=(FullAttentionSpec(4),)), "num_blocks", True),
        (lambda: FullAttentionSpec(block_size=0), "block_size", 0),
        (lambda: SlidingWindowSpec(block_size=4, sliding_window=0), "sliding_window", 0),
        (lambda: KVCacheConfig(num_blocks=8, groups=()), "groups", ()),
        (
            lambda: KVCacheConfig(num_blocks=8, groups=(FullAttentionSpec(4), FullAttentionSpec(8)), hash_block_size=8),
            "hash_block_size",
            8,
        ),
        (
            lambda: KVCacheConfig(
                num_blocks=8, groups=(FullAttentionSpec(4), FullAttentionSpec(8)), scheduler_block_size=4
            ),
            "scheduler_block_size",
            4,
        ),
        (lambda: KVCacheConfig(num_blocks=8, groups=(FullAttentionSpec(4),), hash_block_size=2), "hash_block_size", 2),
        (
            lambda: KVCacheConfig(
                num_blocks=8,
                groups=(FullAttentionSpec(2), ChunkedLocalAttentionSpec(2, attention_chunk_size=4)),
                scheduler_block_size=4,
            ),
            "groups[1].block_size",
            2,
        ),
        (lambda: KVCacheConfig(num_blocks=8, groups=("full",)), "groups[0]", "full"),
        (lambda: KVCacheConfig(num_blocks=8, groups=(FullAttentionSpec(4),), max_model_len=0), "max_model_len", 0),
    ],
    ids=[
        "one-block",
        "bool-num-blocks",
        "zero-block-size",
        "zero-window",
        "no-groups",
        "hash-size-not-dividing-a-group",
        "scheduler-size-not-a-multiple",
        "one-group-hashing-finer",
        "chunked-local-off-the-scheduler-size",
        "not-a-spec",
        "zero-max-model-len",
    ],
)
def test_a_bad_config_raises_invalid_config_naming_the_field_and_value(
    make_config: Callable[[], object], field: str, value: object
) -> None:
    """A configuration value out of range raises InvalidConfig carrying that field and value (no state exists yet)."""
    with pytest.raises(InvalidConfig) as excinfo:
        make_config()
    assert excinfo.value.field == field
    assert excinfo.value.value == value
    assert field in str(excinfo.value)
    assert isinstance(excinfo.value, KVCoreError)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_non_bool_enable_caching_raises_invalid_config(value: object) -> None:
    """enable_caching must be a bool; anything else raises InvalidConfig naming the field and value."""
    with pytest.raises(InvalidConfig) as excinfo:
        KVCacheConfig(num_blocks=8, groups=(FullAttentionSpec(4),), enable_caching=value)  # type: ignore[arg-type]
    assert excinfo.value.field == "enable_caching"
    assert excinfo.value.value == value


@pytest.mark.parametrize(
    "name", ["num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens"]
)
@pytest.mark.parametrize("request_id", ["new", "run"])
def test_a_negative_count_in_allocate_slots_raises_invalid_argument_and_changes_nothing(
    name: str, request_id: str
) -> None:
    """A negative token count is refused with InvalidArgument naming it, for new and running requests alike."""
    manager = busy_manager()
    request = Request(request_id, tokens(100, 6) if request_id == "run" else tokens(0, 9), BLOCK_SIZE)
    request.num_computed_tokens = 6 if request_id == "run" else 0
    counts = {"num_new_tokens": 1, name: -1}
    before = snapshot(manager)
    with pytest.raises(InvalidArgument) as excinfo:
        manager.allocate_slots(request, **counts)
    assert excinfo.value.name == name
    assert excinfo.value.value == -1
    assert snapshot(manager) == before


def test_a_zero_token_allocation_without_computed_tokens_raises_invalid_argument() -> None:
    """Asking for no new tokens while adopting no computed tokens is refused and changes nothing."""
    manager = busy_manager()
    before = snapshot(manager)
    with pytest.raises(InvalidArgument) as excinfo:
        manager.allocate_slots(Request("new", tokens(0, 9), BLOCK_SIZE), 0)
    assert excinfo.value.name == "num_new_tokens"
    assert snapshot(manager) == before


def test_a_prefix_hit_for_a_request_that_holds_blocks_raises_invalid_argument() -> None:
    """A running request takes no new prefix hit; offering one is refused and changes nothing."""
    manager = busy_manager()
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(Request("probe", tokens(0, 9), BLOCK_SIZE))
    request = Request("run", tokens(100, 6), BLOCK_SIZE)
    request.num_computed_tokens = 6
    before = snapshot(manager)
    with pytest.raises(InvalidArgument) as excinfo:
        manager.allocate_slots(request, 1, hit_len_tokens, hit_blocks)
    assert excinfo.value.name == "new_computed_blocks"
    assert snapshot(manager) == before


def test_a_new_request_longer_than_max_model_len_raises_request_too_long_and_changes_nothing() -> None:
    """A 17-token prompt with max_model_len 16 raises RequestTooLong carrying the id and both lengths."""
    manager = busy_manager(max_model_len=16)
    request = Request("long", tokens(0, 17), BLOCK_SIZE)
    hit_blocks, hit_len_tokens = manager.get_computed_blocks(request)
    assert hit_len_tokens == 8
    before = snapshot(manager)
    with pytest.raises(RequestTooLong) as excinfo:
        manager.allocate_slots(request, 17 - hit_len_tokens, hit_len_tokens, hit_blocks)
    assert excinfo.value.request_id == "long"
    assert excinfo.value.num_tokens == 17
    assert excinfo.value.max_model_len == 16
    assert snapshot(manager) == before


def test_a_running_request_growing_past_max_model_len_raises_request_too_long_and_changes_nothing() -> None:
    """A running request asking for slots beyond max_model_len is refused, its table untouched."""
    manager = busy_manager(max_model_len=16)
    request = Request("run", tokens(100, 6), BLOCK_SIZE)
    request.num_computed_tokens = 6
    before = snapshot(manager)
    with pytest.raises(RequestTooLong) as excinfo:
        manager.allocate_slots(request, 11)
    assert excinfo.value.num_tokens == 17
    assert snapshot(manager) == before


def test_freeing_a_block_below_ref_count_zero_raises_ref_count_underflow_and_changes_nothing() -> None:
    """Freeing a held block and a free one together raises for the free one and restores the held one."""
    manager = busy_manager()
    pool = manager.block_pool
    before = snapshot(manager)
    with pytest.raises(RefCountUnderflow) as excinfo:
        pool.free_blocks([pool.blocks[4], pool.blocks[3], pool.blocks[5]])
    assert excinfo.value.block_id == 5
    assert snapshot(manager) == before
    with pytest.raises(RefCountUnderflow) as excinfo:
        pool.free_blocks([pool.blocks[4], pool.blocks[4]])
    assert excinfo.value.block_id == 4
    assert snapshot(manager) == before
    manager.check_invariants()


@pytest.mark.parametrize("bad_id", [8, 99, -1, "3", True])
def test_evict_blocks_with_an_unknown_id_raises_unknown_block_and_evicts_nothing(bad_id: object) -> None:
    """An id outside the pool raises UnknownBlock carrying it, and the valid ids listed before it stay cached."""
    manager = busy_manager()
    before = snapshot(manager)
    with pytest.raises(UnknownBlock) as excinfo:
        manager.evict_blocks([1, 3, bad_id])  # type: ignore[list-item]
    assert excinfo.value.block_id == bad_id
    assert excinfo.value.num_blocks == 8
    assert snapshot(manager) == before


def test_freeing_an_unknown_request_is_a_no_op() -> None:
    """Freeing a request that holds nothing (never allocated, or freed already) changes nothing."""
    manager = busy_manager()
    before = snapshot(manager)
    manager.free("never-seen")
    manager.free(Request("done", tokens(0, 8), BLOCK_SIZE))
    assert snapshot(manager) == before
    manager.free("run")
    after_free = snapshot(manager)
    manager.free("run")
    assert snapshot(manager) == after_free
    manager.check_invariants()
