"""The kvcore free-queue target: a :class:`kvcore.FreeBlockQueue` over blocks named by id."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import kvcore


class KvcoreQueue:
    """A free-block queue that starts holding blocks ``1..num_blocks``, head first.

    Blocks are named by id in both directions, so a machine never touches a
    :class:`kvcore.KVBlock`.  ``queue_factory`` builds the queue from its
    initial blocks; a planted bug replaces it with a subclass.
    """

    name = "kvcore"

    def __init__(
        self,
        num_blocks: int,
        queue_factory: Callable[[Sequence[kvcore.KVBlock]], kvcore.FreeBlockQueue] = kvcore.FreeBlockQueue,
    ) -> None:
        self.blocks = {block_id: kvcore.KVBlock(block_id) for block_id in range(1, num_blocks + 1)}
        self.queue = queue_factory(list(self.blocks.values()))

    def popleft_n(self, n: int) -> list[int] | None:
        """Take the first ``n`` blocks; ``None`` if the queue refused (fewer than ``n`` free)."""
        try:
            taken = self.queue.popleft_n(n)
        except kvcore.OutOfBlocks:
            return None
        return [block.block_id for block in taken]

    def remove(self, block_id: int) -> None:
        self.queue.remove(self.blocks[block_id])

    def append_n(self, block_ids: Sequence[int]) -> None:
        self.queue.append_n([self.blocks[block_id] for block_id in block_ids])

    def prepend_n(self, block_ids: Sequence[int]) -> None:
        self.queue.prepend_n([self.blocks[block_id] for block_id in block_ids])

    def ids(self) -> list[int]:
        """The queue walked head to tail by the forward links."""
        return self.queue.block_ids()

    def ids_from_tail(self) -> list[int]:
        """The queue walked tail to head by the backward links."""
        return self.queue.block_ids_from_tail()

    @property
    def num_free(self) -> int:
        return self.queue.num_free

    def check_internal(self) -> None:
        self.queue.check_invariants()
