"""The block-pool machine against each built-in allocator --target names (kvcore by default)."""

from __future__ import annotations

from kvcheck.targets import load_pool

from .block_pool_machine import block_pool_machine
from .run import run_machine


def test_block_pool_matches_the_pool_model_after_every_step(allocator: str) -> None:
    """Interleaved allocate / touch / cache / free / evict / reset sequences, with caching on or off,
    keep the free order, ref counts and cache entries equal to the pool model's."""
    run_machine(block_pool_machine(load_pool(allocator)))
