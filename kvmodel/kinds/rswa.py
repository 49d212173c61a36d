"""R-SWA: a token attends to the whole prompt and the ``window`` generated tokens before it; a hit is
full attention's, and what lies between the prompt's last block and the window is released."""

from __future__ import annotations

from kvmodel.kinds.base import Group, Kind, ceil_div


class Rswa(Kind):
    full_hit = True
    has_window = True
    keeps_prompt = True

    def validate_window(self, window: int, block_size: int) -> str | None:
        if window < 1:
            return f"an R-SWA window needs at least 1 token, got {window}"
        return None

    def released_blocks(self, group: Group, num_computed_tokens: int, num_prompt_tokens: int, block_size: int) -> range:
        assert group.window is not None
        window_start = max(num_prompt_tokens, num_computed_tokens - group.window)
        return range(ceil_div(num_prompt_tokens, block_size), window_start // block_size)


RSWA = Rswa("rswa")
KINDS = (RSWA,)
