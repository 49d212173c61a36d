"""Sliding-window attention, plain and over MLA's latent vectors: a token attends to the ``window - 1``
tokens before it, so the blocks below the window are released and a hit needs only the window's."""

from __future__ import annotations

from kvmodel.kinds.base import Group, Kind, ceil_div


class SlidingWindow(Kind):
    has_window = True
    local_attention = True
    sliding = True

    def validate_window(self, window: int, block_size: int) -> str | None:
        if window < 2:
            return f"a sliding window needs at least 2 tokens, got {window}"
        return None

    def first_attended_token(self, group: Group, num_computed_tokens: int) -> int:
        assert group.window is not None
        return max(0, num_computed_tokens - group.window + 1)

    def needed_positions(self, group: Group, hit_blocks: int, block_size: int) -> range:
        assert group.window is not None
        return range(max(0, hit_blocks - ceil_div(group.window - 1, block_size)), hit_blocks)

    def admission_cap(self, group: Group, max_in_flight_tokens: int, block_size: int) -> int | None:
        # The window's last W - 1 tokens and the tokens in flight, one block more: it may start inside one.
        assert group.window is not None
        return ceil_div(group.window - 1 + max_in_flight_tokens, block_size) + 1


SLIDING_WINDOW = SlidingWindow("sliding_window")
SLIDING_WINDOW_MLA = SlidingWindow("sliding_window_mla")
KINDS = (SLIDING_WINDOW, SLIDING_WINDOW_MLA)
