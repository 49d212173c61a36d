"""FreeBlockQueue: O(1) queue operations keep the eviction order, and check_invariants notices a broken list."""

from __future__ import annotations

import pytest

from kvcore import FreeBlockQueue, InvalidArgument, KVBlock, OutOfBlocks


def make_queue(num_blocks: int = 5) -> tuple[FreeBlockQueue, list[KVBlock]]:
    """A queue holding blocks 1..num_blocks in id order; index ``i`` of the list is block ``i``."""
    blocks = [KVBlock(block_id) for block_id in range(num_blocks + 1)]
    return FreeBlockQueue(blocks[1:]), blocks


def test_iteration_walks_the_queue_head_first_in_insertion_order() -> None:
    """A new queue yields its blocks in the order they were given, head first."""
    queue, _ = make_queue()
    assert [block.block_id for block in queue] == [1, 2, 3, 4, 5]
    assert queue.block_ids() == [1, 2, 3, 4, 5]
    assert len(queue) == 5
    queue.check_invariants()


def test_popleft_takes_the_head_block_and_unlinks_it() -> None:
    """popleft returns the head block with both links cleared and leaves the rest in order."""
    queue, blocks = make_queue()
    popped = queue.popleft()
    assert popped is blocks[1]
    assert popped.prev_free is None
    assert popped.next_free is None
    assert queue.block_ids() == [2, 3, 4, 5]
    assert queue.num_free == 4
    queue.check_invariants()


def test_popleft_n_takes_the_first_n_blocks_head_first() -> None:
    """popleft_n(3) returns the three head blocks in queue order; popleft_n(0) takes nothing."""
    queue, _ = make_queue()
    assert [block.block_id for block in queue.popleft_n(3)] == [1, 2, 3]
    assert queue.block_ids() == [4, 5]
    assert queue.popleft_n(0) == []
    assert queue.block_ids() == [4, 5]
    assert [block.block_id for block in queue.popleft_n(2)] == [4, 5]
    assert queue.block_ids() == []
    assert queue.num_free == 0
    queue.check_invariants()


def test_popleft_n_beyond_the_free_count_raises_out_of_blocks_and_takes_nothing() -> None:
    """Asking for more blocks than are free raises OutOfBlocks with both counts and leaves the queue as it was."""
    queue, _ = make_queue()
    with pytest.raises(OutOfBlocks) as excinfo:
        queue.popleft_n(6)
    assert excinfo.value.requested == 6
    assert excinfo.value.available == 5
    assert queue.block_ids() == [1, 2, 3, 4, 5]
    with pytest.raises(InvalidArgument):
        queue.popleft_n(-1)
    assert queue.block_ids() == [1, 2, 3, 4, 5]
    queue.check_invariants()


def test_popleft_on_an_empty_queue_raises_out_of_blocks() -> None:
    """An empty queue has no head to hand out."""
    queue = FreeBlockQueue()
    with pytest.raises(OutOfBlocks):
        queue.popleft()
    queue.check_invariants()


def test_remove_unlinks_blocks_from_the_middle_the_head_and_the_tail() -> None:
    """remove takes a block out wherever it sits and keeps the others in order."""
    queue, blocks = make_queue()
    queue.remove(blocks[3])
    assert queue.block_ids() == [1, 2, 4, 5]
    assert blocks[3].prev_free is None
    assert blocks[3].next_free is None
    queue.remove(blocks[1])
    assert queue.block_ids() == [2, 4, 5]
    queue.remove(blocks[5])
    assert queue.block_ids() == [2, 4]
    assert queue.num_free == 2
    queue.check_invariants()


def test_remove_of_a_block_not_in_the_queue_raises_invalid_argument() -> None:
    """Removing a block that is not queued is refused and changes nothing."""
    queue, blocks = make_queue()
    queue.remove(blocks[2])
    with pytest.raises(InvalidArgument) as excinfo:
        queue.remove(blocks[2])
    assert excinfo.value.value == 2
    assert queue.block_ids() == [1, 3, 4, 5]
    queue.check_invariants()


def test_append_n_puts_blocks_at_the_tail_in_the_given_order() -> None:
    """append_n([5, 3]) after [1, 2, 4] gives [1, 2, 4, 5, 3]."""
    queue, blocks = make_queue()
    queue.remove(blocks[3])
    queue.remove(blocks[5])
    queue.append_n([blocks[5], blocks[3]])
    assert queue.block_ids() == [1, 2, 4, 5, 3]
    assert queue.num_free == 5
    queue.check_invariants()


def test_prepend_n_puts_blocks_at_the_head_in_the_given_order() -> None:
    """prepend_n([5, 3]) before [1, 2, 4] gives [5, 3, 1, 2, 4]: the first block given is the next handed out."""
    queue, blocks = make_queue()
    queue.remove(blocks[3])
    queue.remove(blocks[5])
    queue.prepend_n([blocks[5], blocks[3]])
    assert queue.block_ids() == [5, 3, 1, 2, 4]
    assert queue.popleft() is blocks[5]
    queue.check_invariants()


def test_append_n_and_prepend_n_work_on_an_empty_queue_and_with_no_blocks() -> None:
    """Both ends accept blocks when the queue is empty, and an empty batch is a no-op."""
    blocks = [KVBlock(block_id) for block_id in range(4)]
    queue = FreeBlockQueue()
    queue.append_n([])
    queue.prepend_n([])
    assert queue.block_ids() == []
    queue.prepend_n([blocks[2]])
    queue.append_n([blocks[3]])
    queue.prepend_n([blocks[1]])
    assert queue.block_ids() == [1, 2, 3]
    assert queue.num_free == 3
    queue.check_invariants()


def test_a_mixed_sequence_of_operations_keeps_order_and_invariants() -> None:
    """After every operation of a mixed sequence the order is as predicted and check_invariants passes."""
    queue, blocks = make_queue(6)
    steps = [
        (lambda: queue.popleft_n(2), [3, 4, 5, 6]),
        (lambda: queue.prepend_n([blocks[2]]), [2, 3, 4, 5, 6]),
        (lambda: queue.remove(blocks[5]), [2, 3, 4, 6]),
        (lambda: queue.append_n([blocks[1], blocks[5]]), [2, 3, 4, 6, 1, 5]),
        (lambda: queue.remove(blocks[2]), [3, 4, 6, 1, 5]),
        (lambda: queue.popleft(), [4, 6, 1, 5]),
        (lambda: queue.prepend_n([blocks[3], blocks[2]]), [3, 2, 4, 6, 1, 5]),
    ]
    for operation, expected in steps:
        operation()
        assert queue.block_ids() == expected
        assert queue.num_free == len(expected)
        queue.check_invariants()


def test_check_invariants_fails_when_a_backward_link_is_corrupted() -> None:
    """A prev link that does not answer its partner's next link is reported."""
    queue, blocks = make_queue()
    blocks[3].prev_free = blocks[1]
    with pytest.raises(AssertionError, match="link mismatch"):
        queue.check_invariants()


def test_check_invariants_fails_when_a_forward_link_skips_a_block() -> None:
    """A next link that jumps over a block (leaving it linked only backwards) is reported."""
    queue, blocks = make_queue()
    blocks[2].next_free = blocks[4]
    with pytest.raises(AssertionError):
        queue.check_invariants()


def test_check_invariants_fails_when_a_forward_link_makes_a_cycle() -> None:
    """A next link pointing back to an earlier block is reported instead of looping forever."""
    queue, blocks = make_queue()
    blocks[4].next_free = blocks[2]
    with pytest.raises(AssertionError):
        queue.check_invariants()


def test_check_invariants_fails_when_the_free_count_is_wrong() -> None:
    """num_free disagreeing with the length of the list is reported."""
    queue, _ = make_queue()
    queue.num_free += 1
    with pytest.raises(AssertionError, match="num_free=6"):
        queue.check_invariants()
