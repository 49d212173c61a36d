"""The vLLM free-queue target: vLLM's ``FreeKVCacheBlockQueue`` over blocks named by id.

vLLM's queue has no self-check of its own;
:func:`~kvcheck.targets.vllm_internals.check_free_list` walks its links.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcheck.targets.vllm_internals import backward_ids, check_free_list, forward_ids


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
