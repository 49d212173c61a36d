"""A sliding window's retention interval: which of its blocks stay cached, and so hittable.

The expected entries and hits are the ones vLLM 0.33.0 produces for the same steps.
"""

from __future__ import annotations

import pytest

from kvcore import (
    FullAttentionSpec,
    InvalidConfig,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from tests.kvcore.steps import run_step

WINDOW = SlidingWindowSpec(1, sliding_window=2)  # a hit needs one block: the one before its boundary


def window_positions(manager: KVCacheManager, group_id: int, prompt: list[int]) -> list[int]:
    """The table positions of ``prompt``'s blocks that group ``group_id`` has cached."""
    probe = Request("probe", prompt, 1)
    cached = {block_hash for (block_hash, group), _ in manager.cache_entries() if group == group_id}
    return [position for position, block_hash in enumerate(probe.block_hashes) if block_hash in cached]


def test_without_an_interval_a_window_of_one_block_caches_every_block() -> None:
    manager = KVCacheManager(KVCacheConfig(32, (WINDOW,)))
    prompt = list(range(100, 112))
    run_step(manager, Request("a", prompt, 1))
    assert window_positions(manager, 0, prompt) == list(range(12))


def test_an_interval_keeps_the_block_before_each_intervals_end_and_the_replay_boundary() -> None:
    """Every 4 tokens, and before token 11 (a resend of the 12-token prompt hits up to it)."""
    manager = KVCacheManager(KVCacheConfig(32, (WINDOW,), prefix_cache_retention_interval=4))
    prompt = list(range(100, 112))
    run_step(manager, Request("a", prompt, 1))
    assert window_positions(manager, 0, prompt) == [3, 7, 10, 11]
    # A resend hits at its replay boundary; a request diverging at token 10 falls back to token 8.
    assert run_step(manager, Request("b", prompt, 1)) == 11
    assert run_step(manager, Request("c", [*prompt[:10], 7, 7], 1)) == 8
    manager.check_invariants()


def test_an_interval_of_zero_keeps_the_replay_boundary_only() -> None:
    manager = KVCacheManager(KVCacheConfig(32, (WINDOW,), prefix_cache_retention_interval=0))
    prompt = list(range(100, 112))
    run_step(manager, Request("a", prompt, 1))
    assert window_positions(manager, 0, prompt) == [10]


def test_an_eagle_drafter_keeps_the_peeked_block_past_each_boundary() -> None:
    """With the drop, a hit needs two blocks ending one past its boundary; the replay boundaries are a
    block below those of a resend (11 -> 10) and of a longer request (12 -> 11)."""
    manager = KVCacheManager(KVCacheConfig(32, (WINDOW,), use_eagle=True, prefix_cache_retention_interval=4))
    prompt = list(range(100, 112))
    run_step(manager, Request("a", prompt, 1))
    assert window_positions(manager, 0, prompt) == [3, 4, 7, 8, 9, 10, 11]


def test_a_shared_prefix_a_window_did_not_cache_is_kept_once_a_request_computes_it() -> None:
    """Full attention beside a window, interval 0: the first request's window keeps only its replay
    boundary, so a second request sharing 5 tokens misses; it records the shared prefix (found by full
    attention) and its window keeps that boundary's block, so a third request sharing it hits."""
    manager = KVCacheManager(KVCacheConfig(64, (FullAttentionSpec(1), WINDOW), prefix_cache_retention_interval=0))
    first = list(range(100, 108))
    run_step(manager, Request("a", first, 1))
    assert window_positions(manager, 1, first) == [6]
    second = Request("b", [*first[:5], 1, 2, 3, 4, 5], 1)
    assert run_step(manager, second) == 0
    assert second.shared_prefix_boundary == 5
    assert window_positions(manager, 1, second.all_token_ids) == [4, 8]
    third = Request("c", [*first[:5], 9, 9, 9], 1)
    assert run_step(manager, third) == 5
    assert third.shared_prefix_boundary == 0
    manager.check_invariants()


@pytest.mark.parametrize(
    ("groups", "interval", "reason"),
    [
        ((FullAttentionSpec(2),), 4, "no sliding-window or Mamba group"),
        ((FullAttentionSpec(2), SlidingWindowSpec(2, sliding_window=3)), 3, "multiple of scheduler_block_size"),
        ((FullAttentionSpec(2), SlidingWindowSpec(4, sliding_window=3)), 6, "multiple of scheduler_block_size"),
        ((SlidingWindowSpec(2, sliding_window=3),), -2, "must be >= 0"),
        ((SlidingWindowSpec(2, sliding_window=3),), True, "must be None or an int"),
    ],
)
def test_a_retention_interval_vllm_refuses_is_refused_by_name(
    groups: tuple[FullAttentionSpec | SlidingWindowSpec, ...], interval: object, reason: str
) -> None:
    with pytest.raises(InvalidConfig) as refused:
        KVCacheConfig(8, groups, prefix_cache_retention_interval=interval)  # type: ignore[arg-type]
    assert refused.value.field == "prefix_cache_retention_interval"
    assert reason in str(refused.value)


def test_an_interval_of_zero_is_accepted_without_a_window_and_any_interval_beside_mamba() -> None:
    assert KVCacheConfig(8, (FullAttentionSpec(2),), prefix_cache_retention_interval=0)
    assert KVCacheConfig(
        8, (FullAttentionSpec(2), MambaSpec(2)), enable_caching=False, prefix_cache_retention_interval=4
    )
