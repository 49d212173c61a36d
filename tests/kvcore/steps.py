"""Scheduler steps that drive a KVCacheManager the way vLLM's scheduler does."""

from __future__ import annotations

from kvcore import KVCacheManager, Request

BLOCK_SIZE = 4


def tokens(start: int, n_tokens: int) -> list[int]:
    """``n_tokens`` distinct token ids from ``start`` on."""
    return list(range(start, start + n_tokens))


def run_step(manager: KVCacheManager, request: Request, num_new_tokens: int | None = None) -> int:
    """Schedule one step of ``request`` and mark its tokens computed; returns the local hit length in tokens.

    A request that holds no blocks first takes its local prefix hit.  Without
    ``num_new_tokens`` the step computes every remaining token.
    """
    hit_blocks = None
    hit_len_tokens = 0
    if request.request_id not in manager.request_ids():
        hit_blocks, hit_len_tokens = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - request.num_computed_tokens - hit_len_tokens
    new_blocks = manager.allocate_slots(request, num_new_tokens, hit_len_tokens, hit_blocks)
    assert new_blocks is not None, f"step of {request.request_id!r} was refused"
    request.num_computed_tokens += hit_len_tokens + num_new_tokens
    return hit_len_tokens
