"""BlockPool: the eviction-order contract of freed blocks, touching, and eviction on allocation."""

from __future__ import annotations

from kvcore import BlockPool, KVBlock, hash_request_blocks


def ids(blocks: list[KVBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def cache_all(pool: BlockPool, blocks: list[KVBlock], first_token: int, group_id: int = 0) -> None:
    """Enter ``blocks`` in the prefix cache as the full blocks of a prompt of distinct tokens."""
    hashes = hash_request_blocks(list(range(first_token, first_token + 4 * len(blocks))), 4)
    pool.cache_blocks(blocks, hashes, group_id)


def test_a_new_pool_holds_every_block_but_the_null_block_in_id_order() -> None:
    """Block 0 is the null block, out of the queue; blocks 1..n-1 are free in id order."""
    pool = BlockPool(num_blocks=6, enable_caching=False)
    assert pool.free_block_ids() == [1, 2, 3, 4, 5]
    assert pool.null_block.block_id == 0
    assert pool.null_block.is_null
    pool.check_invariants()


def test_freed_blocks_are_reused_lifo_when_caching_is_off() -> None:
    """With caching off, the next allocation reuses the most recently freed request's blocks first."""
    pool = BlockPool(num_blocks=9, enable_caching=False)
    request_a = pool.get_new_blocks(3)
    request_b = pool.get_new_blocks(2)
    assert ids(request_a) == [1, 2, 3]
    assert ids(request_b) == [4, 5]
    # free_table frees tail first: a is freed as 3, 2, 1, then b as 5, 4.
    pool.free_table(request_a)
    assert pool.free_block_ids() == [3, 2, 1, 6, 7, 8]
    pool.free_table(request_b)
    assert pool.free_block_ids() == [5, 4, 3, 2, 1, 6, 7, 8]
    assert ids(pool.get_new_blocks(3)) == [5, 4, 3]
    assert ids(pool.get_new_blocks(3)) == [2, 1, 6]
    pool.check_invariants()


def test_blocks_freed_one_call_at_a_time_with_caching_off_come_back_in_reverse_free_order() -> None:
    """With caching off, blocks freed by separate calls are handed out last-freed first."""
    pool = BlockPool(num_blocks=6, enable_caching=False)
    blocks = pool.get_new_blocks(3)
    for block in blocks:
        pool.free_blocks([block])
    assert pool.free_block_ids() == [3, 2, 1, 4, 5]
    assert ids(pool.get_new_blocks(2)) == [3, 2]


def test_freed_hashed_blocks_still_go_to_the_head_when_caching_is_off() -> None:
    """With caching off a block carrying a hash is still reused LIFO, not queued for LRU eviction."""
    pool = BlockPool(num_blocks=6, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    cache_all(pool, blocks, first_token=0)
    pool.free_table(blocks)
    assert pool.free_block_ids() == [2, 1, 3, 4, 5]
    assert ids(pool.get_new_blocks(1)) == [2]


def test_cached_blocks_are_evicted_lru_and_uncached_freed_blocks_go_to_the_head() -> None:
    """With caching on, cached blocks queue oldest-freed first (tail block before head) and uncached ones jump ahead."""
    pool = BlockPool(num_blocks=8, enable_caching=True)
    request_a = pool.get_new_blocks(3)
    request_b = pool.get_new_blocks(3)
    assert ids(request_a) == [1, 2, 3]
    assert ids(request_b) == [4, 5, 6]
    cache_all(pool, request_a, first_token=0)
    # b's last block (6) is partial, so it stays uncached.
    cache_all(pool, request_b[:2], first_token=100)
    pool.free_table(request_a)
    assert pool.free_block_ids() == [7, 3, 2, 1]
    pool.free_table(request_b)
    assert pool.free_block_ids() == [6, 7, 3, 2, 1, 5, 4]
    pool.check_invariants()

    # Allocation pops the head: the uncached blocks first, then the LRU cached ones, evicting them.
    assert ids(pool.get_new_blocks(3)) == [6, 7, 3]
    assert sorted(block_id for _, block_id in pool.cache_entries()) == [1, 2, 4, 5]
    assert pool.blocks[3].block_hash is None
    assert ids(pool.get_new_blocks(4)) == [2, 1, 5, 4]
    assert pool.cache_entries() == []
    pool.check_invariants()


def test_touching_a_free_cached_block_takes_it_out_of_the_queue() -> None:
    """A touch on a ref-count-0 block removes it from the free queue; a touch on a held block only counts."""
    pool = BlockPool(num_blocks=6, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    cache_all(pool, blocks, first_token=0)
    pool.free_table(blocks)
    assert pool.free_block_ids() == [4, 5, 3, 2, 1]
    pool.touch([blocks[1]])
    assert pool.free_block_ids() == [4, 5, 3, 1]
    assert pool.blocks[2].ref_cnt == 1
    pool.touch([blocks[1], pool.null_block])
    assert pool.free_block_ids() == [4, 5, 3, 1]
    assert pool.blocks[2].ref_cnt == 2
    assert pool.null_block.ref_cnt == 0
    pool.check_invariants()


def test_freeing_the_null_block_is_skipped() -> None:
    """The null block in a freed table neither enters the queue nor changes its ref count."""
    pool = BlockPool(num_blocks=4, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.free_table([pool.null_block, *blocks])
    assert pool.free_block_ids() == [2, 1, 3]
    assert pool.null_block.ref_cnt == 0
    pool.check_invariants()


def test_a_block_shared_by_two_holders_is_freed_only_by_the_last() -> None:
    """A block with ref count 2 stays out of the queue after one free and joins it after the second."""
    pool = BlockPool(num_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(1)
    cache_all(pool, blocks, first_token=0)
    pool.touch(blocks)
    pool.free_blocks(blocks)
    assert pool.free_block_ids() == [2, 3]
    assert pool.blocks[1].ref_cnt == 1
    pool.free_blocks(blocks)
    assert pool.free_block_ids() == [2, 3, 1]
    pool.check_invariants()


def test_usage_counts_held_blocks_against_the_usable_ones() -> None:
    """Usage is the held fraction of the blocks other than the null block."""
    pool = BlockPool(num_blocks=5, enable_caching=False)
    assert pool.usage == 0.0
    pool.get_new_blocks(1)
    assert pool.usage == 0.25
    pool.get_new_blocks(3)
    assert pool.usage == 1.0
