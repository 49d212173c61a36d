"""Chunked local attention: a token attends to the tokens of its own chunk of ``window`` tokens, so
earlier chunks' blocks are released and a hit needs the blocks of the boundary's own chunk."""

from __future__ import annotations

from kvmodel.kinds.base import Group, Kind, ceil_div


class ChunkedLocal(Kind):
    has_window = True
    local_attention = True
    chunked = True

    def validate_window(self, window: int, block_size: int) -> str | None:
        if window < 1 or window % block_size:
            return f"an attention chunk must be a positive multiple of block_size={block_size}, got {window}"
        return None

    def first_attended_token(self, group: Group, num_computed_tokens: int) -> int:
        assert group.window is not None
        return (num_computed_tokens // group.window) * group.window

    def needed_positions(self, group: Group, hit_blocks: int, block_size: int) -> range:
        assert group.window is not None
        hit_tokens = hit_blocks * block_size
        chunk_start = (hit_tokens // group.window) * group.window
        return range(chunk_start // block_size, hit_blocks)

    def admission_cap(self, group: Group, max_in_flight_tokens: int, block_size: int) -> int | None:
        # A chunk and the tokens in flight.
        assert group.window is not None
        return ceil_div(group.window + max_in_flight_tokens, block_size)


CHUNKED_LOCAL = ChunkedLocal("chunked_local")
KINDS = (CHUNKED_LOCAL,)
