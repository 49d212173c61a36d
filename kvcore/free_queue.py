"""The free-block queue: free blocks in eviction order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kvcore.block import KVBlock
from kvcore.errors import InvalidArgument, OutOfBlocks


class FreeBlockQueue:
    """A doubly linked list of free blocks, head first.

    The head is the next block handed out; the tail is the last.  Every
    operation but iteration is O(1) per block moved: ``popleft``,
    ``popleft_n``, ``remove`` (from anywhere), ``append_n`` and ``prepend_n``.
    Two sentinel nodes (id -1) bound the list so that no operation branches on
    an empty queue.  Links live in the blocks themselves; a block not in the
    queue has both links ``None``.
    """

    __slots__ = ("_head", "_tail", "num_free")

    def __init__(self, blocks: Sequence[KVBlock] = ()) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        self.append_n(blocks)

    def __len__(self) -> int:
        return self.num_free

    def __iter__(self) -> Iterator[KVBlock]:
        node = self._head.next_free
        tail = self._tail
        while node is not tail:
            assert node is not None
            yield node
            node = node.next_free

    def block_ids(self) -> list[int]:
        """The ids of the free blocks walked head to tail by the forward links."""
        return self._walk(self._head.next_free, self._tail, forward=True)

    def block_ids_from_tail(self) -> list[int]:
        """The ids of the free blocks walked tail to head by the backward links."""
        return self._walk(self._tail.prev_free, self._head, forward=False)

    def _walk(self, node: KVBlock | None, end: KVBlock, forward: bool) -> list[int]:
        # Bounded so that a corrupted (cyclic) list still returns; callers compare lengths.
        ids: list[int] = []
        while node is not None and node is not end and len(ids) <= self.num_free + 1:
            ids.append(node.block_id)
            node = node.next_free if forward else node.prev_free
        return ids

    def popleft(self) -> KVBlock:
        """Take the head block out of the queue."""
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVBlock]:
        """Take the first ``n`` blocks out of the queue, head first."""
        if n < 0:
            raise InvalidArgument("n", n, "must be >= 0")
        if n > self.num_free:
            raise OutOfBlocks(requested=n, available=self.num_free)
        taken: list[KVBlock] = []
        node = self._head.next_free
        for _ in range(n):
            assert node is not None
            taken.append(node)
            following = node.next_free
            node.prev_free = node.next_free = None
            node = following
        assert node is not None
        self._head.next_free = node
        node.prev_free = self._head
        self.num_free -= n
        return taken

    def remove(self, block: KVBlock) -> None:
        """Take ``block`` out of the queue, wherever it is."""
        prev, following = block.prev_free, block.next_free
        if prev is None or following is None:
            raise InvalidArgument("block", block.block_id, "is not in the free queue")
        prev.next_free = following
        following.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def append_n(self, blocks: Iterable[KVBlock]) -> None:
        """Put ``blocks`` at the tail, in the given order (the last ends up last)."""
        last = self._tail.prev_free
        assert last is not None
        added = 0
        for block in blocks:
            block.prev_free = last
            last.next_free = block
            last = block
            added += 1
        last.next_free = self._tail
        self._tail.prev_free = last
        self.num_free += added

    def prepend_n(self, blocks: Iterable[KVBlock]) -> None:
        """Put ``blocks`` at the head, in the given order (the first ends up first)."""
        first = self._head.next_free
        assert first is not None
        prev = self._head
        added = 0
        for block in blocks:
            block.prev_free = prev
            prev.next_free = block
            prev = block
            added += 1
        prev.next_free = first
        first.prev_free = prev
        self.num_free += added

    def check_invariants(self) -> None:
        """Walk the list both ways and assert it is well formed.

        Forward and backward walks visit the same blocks in mirrored order,
        each link is answered by its partner, no block appears twice (no
        cycle), and the walk length equals ``num_free``.
        """
        forward: list[KVBlock] = []
        seen: set[int] = set()
        node = self._head
        assert node.prev_free is None, "head sentinel has a predecessor"
        while node.next_free is not None:
            following = node.next_free
            assert following.prev_free is node, (
                f"link mismatch: {node.block_id}.next={following.block_id} "
                f"but {following.block_id}.prev={getattr(following.prev_free, 'block_id', None)}"
            )
            node = following
            if node is self._tail:
                break
            assert id(node) not in seen, f"block {node.block_id} appears twice (cycle)"
            seen.add(id(node))
            forward.append(node)
        assert node is self._tail, "forward walk did not reach the tail sentinel"
        assert self._tail.next_free is None, "tail sentinel has a successor"
        backward: list[KVBlock] = []
        node = self._tail
        while node.prev_free is not None and node.prev_free is not self._head:
            node = node.prev_free
            backward.append(node)
            assert len(backward) <= len(forward), "backward walk is longer than forward walk"
        assert backward[::-1] == forward, "forward and backward walks disagree"
        assert len(forward) == self.num_free, f"num_free={self.num_free} but the list holds {len(forward)} blocks"
