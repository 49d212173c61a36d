"""Mamba state groups in vLLM's ``none`` cache mode: one live state, plus blocks for draft states."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block import KVBlock
from kvcore.config import MambaSpec
from kvcore.managers.base import SingleTypeManager, TakesNoHit


class MambaManager(TakesNoHit, SingleTypeManager):
    """A request keeps the block holding the state of its last computed token, and the blocks after it.

    Once ``n`` tokens are computed, the next token reads only token
    ``n - 1``'s state: every block before that token's is freed and replaced
    by the null block, like a one-token window.  Every allocation asks for
    ``num_speculative_blocks`` blocks more than the slots need: a verifier
    writes the states of draft tokens there.  The group takes no prefix hit
    (caching is off with this mode).
    """

    kind = "mamba"
    spec: MambaSpec

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)

    def _with_speculative_blocks(self, num_tokens: int) -> int:
        return num_tokens + self.spec.num_speculative_blocks * self.block_size

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        return super().num_blocks_to_allocate(
            request_id,
            self._with_speculative_blocks(num_tokens),
            new_computed_blocks,
            total_computed_tokens,
            apply_admission_cap,
        )

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVBlock]:
        return super().allocate_new_blocks(request_id, self._with_speculative_blocks(num_tokens))
