"""The vLLM free-queue target: vLLM 0.33.0's ``FreeKVCacheBlockQueue`` over blocks named by id.

vLLM's queue has no self-check of its own; :func:`check_free_list` walks its
links and is shared with the vLLM block-pool target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def walk_ids(node: Any, end: Any, limit: int, forward: bool) -> list[int]:
    """Block ids from ``node`` up to ``end`` by the forward (or backward) links.

    Bounded by ``limit`` so that a corrupted (cyclic) list still returns;
    callers compare lengths.
    """
    ids: list[int] = []
    while node is not None and node is not end and len(ids) <= limit:
        ids.append(node.block_id)
        node = node.next_free_block if forward else node.prev_free_block
    return ids


def forward_ids(queue: Any) -> list[int]:
    """A vLLM free queue's ids, head (next handed out) to tail."""
    return walk_ids(
        queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail, queue.num_free_blocks + 1, True
    )


def backward_ids(queue: Any) -> list[int]:
    """A vLLM free queue's ids walked tail to head by the backward links."""
    return walk_ids(
        queue.fake_free_list_tail.prev_free_block, queue.fake_free_list_head, queue.num_free_blocks + 1, False
    )


def check_free_list(queue: Any) -> None:
    """Assert that a vLLM free queue is a well-formed doubly linked list.

    The sentinels have no outer links, every link is answered by its partner,
    no block appears twice, and the walk has ``num_free_blocks`` blocks.
    """
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    assert head.prev_free_block is None, "the head sentinel has a predecessor"
    assert tail.next_free_block is None, "the tail sentinel has a successor"
    seen: set[int] = set()
    node = head
    while node is not tail:
        following = node.next_free_block
        assert following is not None, f"the forward walk stops at block {node.block_id} before the tail sentinel"
        assert following.prev_free_block is node, (
            f"link mismatch: {node.block_id}.next={following.block_id} "
            f"but {following.block_id}.prev={getattr(following.prev_free_block, 'block_id', None)}"
        )
        if following is not tail:
            assert id(following) not in seen, f"block {following.block_id} appears twice (cycle)"
            seen.add(id(following))
        node = following
    assert len(seen) == queue.num_free_blocks, f"{len(seen)} blocks linked, num_free_blocks={queue.num_free_blocks}"


class VllmQueue:
    """vLLM's free-block queue, starting with blocks ``1..num_blocks`` head first, named by id."""

    name = "vllm"

    def __init__(self, num_blocks: int) -> None:
        from kvcheck.targets.vllm_target import require_vllm

        v = require_vllm()
        self.blocks = {block_id: v.KVCacheBlock(block_id) for block_id in range(1, num_blocks + 1)}
        self.queue = v.FreeKVCacheBlockQueue(list(self.blocks.values()))

    def _blocks(self, block_ids: Sequence[int]) -> list[Any]:
        return [self.blocks[block_id] for block_id in block_ids]

    def popleft_n(self, n: int) -> list[int] | None:
        """Take the first ``n`` blocks; ``None`` if the queue refused (fewer than ``n`` free).

        vLLM refuses with an assertion checked before anything changes.
        """
        try:
            taken = self.queue.popleft_n(n)
        except AssertionError:
            return None
        return [block.block_id for block in taken]

    def remove(self, block_id: int) -> None:
        self.queue.remove(self.blocks[block_id])

    def append_n(self, block_ids: Sequence[int]) -> None:
        self.queue.append_n(self._blocks(block_ids))

    def prepend_n(self, block_ids: Sequence[int]) -> None:
        self.queue.prepend_n(self._blocks(block_ids))

    def ids(self) -> list[int]:
        return forward_ids(self.queue)

    def ids_from_tail(self) -> list[int]:
        return backward_ids(self.queue)

    @property
    def num_free(self) -> int:
        return int(self.queue.num_free_blocks)

    def check_internal(self) -> None:
        check_free_list(self.queue)
