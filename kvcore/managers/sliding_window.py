"""Sliding-window attention: blocks that leave the window are freed."""

from __future__ import annotations

from collections.abc import Sequence

from kvcore.block_pool import BlockPool
from kvcore.blocks_math import ceil_div
from kvcore.config import AttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from kvcore.hashing import BlockHash
from kvcore.managers.base import HitBlocks, SingleTypeManager, block_hashes_at, drop_last_block
from kvcore.request import Request


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

    def admission_cap(self, max_in_flight_tokens: int, max_model_len: int | None, block_size: int) -> int | None:
        # The window's last W - 1 tokens plus the tokens in flight (frees wait
        # for them), and one block more: the window may start inside a block.
        num_tokens = self.spec.sliding_window - 1 + max_in_flight_tokens
        if max_model_len is not None:
            num_tokens = min(num_tokens, max_model_len)
        return ceil_div(num_tokens, block_size) + 1

    def cached_positions(self, request: Request, start: int, end: int, replay_boundaries: Sequence[int]) -> list[int]:
        """Only the blocks a hit can need: those of the window (and an EAGLE peek's block) before a
        boundary a hit can end on.

        Without a retention interval, those boundaries are every multiple of
        the scheduler block size (so with hits one block apart, every block is
        cached).  A retention interval keeps the boundaries every interval
        tokens (none for 0), and always the request's replay boundaries and
        the end of a prefix it shares with a request looked up before (where
        a hit a group found stopped), each rounded down to a hit boundary.
        """
        block_size = self.block_size
        alignment = self.hit_alignment
        if alignment % block_size:
            return list(range(start, end))
        needed = contiguous_blocks_for_hit(self.spec.sliding_window, block_size) + (1 if self.drops_hits else 0)
        # The run before a boundary ends on the block past it when an EAGLE drafter peeks there.
        shift = 1 if self.drops_hits else 0
        retention = self.retention_interval
        interval = alignment if retention is None else retention
        kept: set[int] = set()
        if interval:
            per_interval = interval // block_size
            if needed >= per_interval:
                return list(range(start, end))
            kept.update(p for p in range(max(start, shift), end) if (p - shift) % per_interval >= per_interval - needed)
        if retention is not None:
            for boundary in self.reachable_boundaries(request, replay_boundaries):
                stop = boundary // alignment * alignment // block_size + shift
                kept.update(range(max(start, stop - needed), min(end, stop)))
        return sorted(kept)

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
