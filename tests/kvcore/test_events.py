"""KV cache events: kvcore reports every change to its prefix cache, in order, and nothing else."""

from __future__ import annotations

from kvcore import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
)
from tests.kvcore.steps import BLOCK_SIZE, run_step, tokens


def make_manager(num_blocks: int = 8, enable_kv_cache_events: bool = True, *groups: object) -> KVCacheManager:
    specs = groups or (FullAttentionSpec(BLOCK_SIZE),)
    return KVCacheManager(
        KVCacheConfig(num_blocks=num_blocks, groups=specs, enable_kv_cache_events=enable_kv_cache_events)
    )


def test_caching_a_prefill_stores_its_full_blocks_in_one_event() -> None:
    """One BlockStored per caching call: the full blocks' hashes, no parent, the tokens of those blocks."""
    manager = make_manager()
    request = Request("a", tokens(0, 9), BLOCK_SIZE)
    run_step(manager, request)
    assert manager.take_events() == [
        BlockStored(
            block_hashes=tuple(request.block_hashes[:2]),
            parent_block_hash=None,
            token_ids=tuple(tokens(0, 8)),
            block_size=BLOCK_SIZE,
            group_idx=0,
        )
    ]
    assert manager.take_events() == [], "taking the events empties the queue"


def test_a_later_store_names_the_last_cached_block_as_its_parent() -> None:
    """Blocks cached by a later step come with the hash of the block before them."""
    manager = make_manager()
    request = Request("a", tokens(0, 6), BLOCK_SIZE)
    run_step(manager, request)
    manager.take_events()
    request.append_output_token_ids([100, 101])
    assert manager.allocate_slots(request, 2) is not None
    request.num_computed_tokens += 2
    [event] = manager.take_events()
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash == request.block_hashes[0]
    assert event.block_hashes == (request.block_hashes[1],)
    assert event.token_ids == (4, 5, 100, 101)


def test_reusing_a_cached_block_reports_its_removal_and_a_reset_reports_a_clear() -> None:
    """A cached free block handed out again loses its entry (BlockRemoved with its hash and group);
    a successful reset queues AllBlocksCleared, a refused one nothing."""
    manager = make_manager(num_blocks=4)
    request = Request("a", tokens(0, 8), BLOCK_SIZE)
    run_step(manager, request)
    manager.free(request)
    manager.take_events()
    assert manager.free_block_ids() == [3, 2, 1]
    other = Request("b", tokens(50, 12), BLOCK_SIZE)
    run_step(manager, other)
    events = manager.take_events()
    # Blocks 2 then 1 are handed out (in free-queue order), each evicted as it goes.
    assert events[:2] == [BlockRemoved((request.block_hashes[1],), 0), BlockRemoved((request.block_hashes[0],), 0)]
    assert isinstance(events[2], BlockStored)
    assert manager.reset_prefix_cache() is False
    assert manager.take_events() == []
    manager.free(other)
    assert manager.reset_prefix_cache() is True
    assert manager.take_events() == [AllBlocksCleared()]


def test_explicit_eviction_reports_each_entry_dropped() -> None:
    """evict_blocks reports a removal for every cached block it drops, none for an uncached one."""
    manager = make_manager()
    request = Request("a", tokens(0, 9), BLOCK_SIZE)
    run_step(manager, request)
    manager.take_events()
    manager.evict_blocks([3, 2])
    assert manager.take_events() == [BlockRemoved((request.block_hashes[1],), 0)]


def test_null_blocks_of_a_sliding_window_are_not_stored() -> None:
    """A store leaves out the positions a window already dropped, but still covers their tokens."""
    manager = make_manager(16, True, FullAttentionSpec(BLOCK_SIZE), SlidingWindowSpec(BLOCK_SIZE, 2))
    request = Request("a", tokens(0, 6), BLOCK_SIZE)
    run_step(manager, request)
    manager.take_events()
    request.append_output_token_ids(list(range(100, 107)))
    assert manager.allocate_slots(request, 7) is not None
    request.num_computed_tokens += 7
    manager.take_events()
    request.append_output_token_ids([200])
    assert manager.allocate_slots(request, 1) is not None  # the window drops the first blocks now
    request.num_computed_tokens += 1
    table = manager.get_block_ids("a")[1]
    assert table[0] == 0
    manager.free(request)
    assert manager.take_events() == []


def test_no_event_is_queued_unless_enabled() -> None:
    manager = make_manager(8, False)
    request = Request("a", tokens(0, 9), BLOCK_SIZE)
    run_step(manager, request)
    manager.free(request)
    assert manager.reset_prefix_cache() is True
    assert manager.take_events() == []
