"""Groups whose blocks belong to one request and are never cached: ring buffers and cross-attention."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block import KVBlock
from kvcore.blocks_math import ceil_div
from kvcore.errors import InvalidArgument
from kvcore.managers.base import SingleTypeManager, TakesNoHit
from kvcore.request import Request


class _UncachedManager(TakesNoHit, SingleTypeManager):
    """A group outside the prefix cache: it takes no hit and caches nothing."""

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        if new_computed_blocks:
            raise InvalidArgument(
                "new_computed_blocks", len(new_computed_blocks), f"group {self.group_id} ({self.kind}) takes no hit"
            )

    def cache_blocks(self, request: Request, num_tokens: int, replay_boundaries: Sequence[int] = ()) -> None:
        return


class CircularBufferManager(_UncachedManager):
    """One block per request, claimed at its first allocation and kept until it is freed."""

    kind = "ring"
    zeroed = False

    def _claim(self, request_id: str) -> list[KVBlock]:
        table = self.req_to_blocks.setdefault(request_id, [])
        if table:
            return []
        table.extend(self.pool.get_new_blocks(1))
        return list(table)

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
    ) -> int:
        return 0 if self.req_to_blocks.get(request_id) else 1

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVBlock]:
        return self._claim(request_id)

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        self._claim(request_id)


class CrossAttentionManager(_UncachedManager):
    """Blocks for the encoder's tokens, allocated once when the request is scheduled from waiting.

    The coordinator hands this group the encoder token count in place of the
    decoder's: ``num_tokens`` below counts encoder tokens, and is 0 on the
    steps of a running request, which then need nothing more.
    """

    kind = "cross_attention"

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int | None = None,
    ) -> int:
        return max(0, ceil_div(num_tokens, self.block_size) - len(self.req_to_blocks.get(request_id, ())))

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        return
