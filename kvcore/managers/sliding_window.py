"""Sliding-window attention: blocks that leave the window are freed."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block_pool import BlockPool
from kvcore.blocks_math import ceil_div
from kvcore.config import AttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from kvcore.hashing import BlockHash
from kvcore.managers.base import HitBlocks, SingleTypeManager, block_hashes_at, drop_last_block


def _trim_to_alignment(hit: HitBlocks, block_size: int, alignment: int) -> None:
    """Drop trailing blocks until the hit ends on the alignment (as vLLM 0.33.0 trims a short run)."""
    while len(hit[0]) * block_size % alignment:
        for group_blocks in hit:
            group_blocks.pop()


def contiguous_blocks_for_hit(sliding_window: int, block_size: int) -> int:
    """Cached blocks a hit needs right before its boundary: those covering the last ``window - 1`` tokens."""
    return ceil_div(sliding_window - 1, block_size)


class SlidingWindowManager(SingleTypeManager):
    """A token attends to the ``sliding_window`` tokens ending with it.

    After ``n`` tokens are computed, the next token's window starts at
    ``n - sliding_window + 1``; every block wholly before that is freed and
    its table entry becomes the null block.
    """

    kind = "sliding_window"
    spec: SlidingWindowSpec | SlidingWindowMLASpec

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.spec.sliding_window + 1)

    def admission_cap(self, max_in_flight_tokens: int, max_model_len: int | None) -> int | None:
        # The window's last W - 1 tokens plus the tokens in flight (frees wait
        # for them), and one block more: the window may start inside a block.
        num_tokens = self.spec.sliding_window - 1 + max_in_flight_tokens
        if max_model_len is not None:
            num_tokens = min(num_tokens, max_model_len)
        return ceil_div(num_tokens, self.block_size) + 1

    def caches_position(self, position: int) -> bool:
        """Only the blocks a hit can need: with hits aligned to more than a block, those of the window
        (and an EAGLE peek's block) before each aligned boundary."""
        per_boundary, rest = divmod(self.hit_alignment, self.block_size)
        if rest or per_boundary == 1:
            return True
        needed = contiguous_blocks_for_hit(self.spec.sliding_window, self.block_size) + (1 if self.drops_hits else 0)
        if needed >= per_boundary:
            return True
        shift = 1 if self.drops_hits else 0
        return position >= shift and (position - shift) % per_boundary >= per_boundary - needed

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        group_ids: Sequence[int],
        pool: BlockPool,
        spec: AttentionSpec,
        drop_last: bool = False,
        alignment: int | None = None,
    ) -> tuple[HitBlocks, int]:
        """Scan from the longest candidate down for enough contiguous cached blocks.

        A hit ending at block ``i + k`` needs the ``k`` blocks before that
        boundary cached (``k`` from :func:`contiguous_blocks_for_hit`); the
        earlier positions are returned as null blocks.  The scan stops at the
        first (longest) such run.  Without one, a run of cached blocks from
        block 0 on is still a (short) hit.  Each boundary is visited once, so
        the scan is linear in the number of candidate blocks.  With
        ``drop_last`` the run needs one block more, which is then dropped:
        the hit still covers the window before its (lower) boundary.
        """
        assert isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec)
        block_size = spec.block_size
        align = alignment or block_size
        block_hashes = block_hashes_at(block_hashes, pool.hash_block_size, block_size)
        needed = contiguous_blocks_for_hit(spec.sliding_window, block_size) + (1 if drop_last else 0)
        max_num_blocks = max_length // block_size
        hit: HitBlocks = tuple([pool.null_block] * max_num_blocks for _ in group_ids)
        run = 0
        end = None
        for i in range(max_num_blocks - 1, -1, -1):
            cached = pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                run = 0
                continue
            # A run may start only where the hit (after the drop) ends on the alignment.
            if run == 0 and (i if drop_last else i + 1) * block_size % align:
                continue
            for group_blocks, block in zip(hit, cached):
                group_blocks[i] = block
            run += 1
            if run >= needed:
                end = i + run
                break
        if end is None:
            end = run
            for group_blocks in hit:
                del group_blocks[end:]
            _trim_to_alignment(hit, block_size, align)
        for group_blocks in hit:
            del group_blocks[end:]
        if drop_last and hit[0]:
            drop_last_block(hit)
            _trim_to_alignment(hit, block_size, align)
        return hit, len(hit[0]) * block_size
