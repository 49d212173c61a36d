"""Reference sliding-window attention (R-SWA): the prompt and a window of generated tokens are kept."""

from __future__ import annotations

from kvcore.blocks_math import ceil_div
from kvcore.config import RSWASpec
from kvcore.managers.full import FullAttentionManager


class RSWAManager(FullAttentionManager):
    """Every token attends to the whole prompt and to the last ``rswa_window`` tokens before it.

    The blocks wholly in the gap between the two, from the first block
    after the prompt's last one to the block holding the window's first
    token, are freed and replaced by the null block.  Hits and admission are
    full attention's: the gap is freed only once the request runs.
    """

    kind = "rswa"
    spec: RSWASpec

    def released_block_range(self, num_computed_tokens: int, num_prompt_tokens: int) -> tuple[int, int]:
        window_start = max(num_prompt_tokens, num_computed_tokens - self.spec.rswa_window)
        return ceil_div(num_prompt_tokens, self.block_size), window_start // self.block_size
