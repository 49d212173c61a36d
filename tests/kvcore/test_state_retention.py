"""Sparse state retention of an align-mode Mamba group (``prefix_cache_retention_interval``): only the
states a later hit can resume from are cached, and with an interval of 0 only the chunk ending the
prefill keeps a prefill checkpoint.

The expected tables, cache entries and hits are the ones vLLM 0.33.0 produces for the same steps
(``tests/vllm/test_vllm_state_retention.py`` runs them there).
"""

from __future__ import annotations

import pytest

from kvcore import FullAttentionSpec, KVCacheConfig, KVCacheManager, MambaSpec, Request
from tests.kvcore.test_prefill_checkpoints import CHECKPOINTED, cached_keys, schedule

ALIGNED = MambaSpec(2, cache_mode="align")


def prefill(retention: int | None) -> tuple[KVCacheManager, Request]:
    """Full attention and an align-mode Mamba group, 2-token blocks: a 12-token prompt computed in chunks
    ending on 4, 10 (its replay boundary, the last block boundary before its last token) and 12 tokens,
    then finished."""
    config = KVCacheConfig(32, [FullAttentionSpec(2), ALIGNED], prefix_cache_retention_interval=retention)
    manager = KVCacheManager(config)
    request = Request("a", list(range(12)), 2)
    for chunk in (4, 6, 2):
        schedule(manager, request, chunk)
    manager.free(request)
    return manager, request


@pytest.mark.parametrize(
    ("retention", "cached_states"),
    [(None, [2, 5, 6]), (0, [5]), (4, [2, 5, 6]), (8, [5])],
)
def test_a_retention_interval_caches_only_the_states_a_hit_resumes_from(
    retention: int | None, cached_states: list[int]
) -> None:
    """States after 4, 10 and 12 tokens were computed (positions 1, 4 and 5, the others null).  With no
    interval each is cached; with 0 only the replay boundary's (10 tokens); every 4 tokens, the states
    after a multiple of 4 and the replay boundary's; every 8, none but the replay boundary's."""
    manager, request = prefill(retention)
    keys = cached_keys(manager, 1)
    hashes = request.block_hashes
    assert sorted(hashes.index(key) + 1 for key in keys.values()) == cached_states


@pytest.mark.parametrize(("retention", "hit"), [(None, 4), (0, 0), (4, 4)])
def test_a_shorter_shared_prefix_misses_a_state_the_interval_left_out(retention: int | None, hit: int) -> None:
    """A request sharing the first 6 tokens hits the state after 4 where it is cached, nothing under an
    interval of 0; every request sharing the first 11 hits the replay boundary's state after 10."""
    manager, _ = prefill(retention)
    assert schedule(manager, Request("b", [*range(6), 90, 91, 92], 2), 9 - hit) == hit
    assert schedule(manager, Request("c", [*range(11), 93], 2), 2) == 10
    manager.check_invariants()


def test_the_state_at_a_shared_prefix_end_is_kept() -> None:
    """Under an interval of 0: a request sharing 6 tokens with the finished prompt finds full attention
    cached there but no Mamba state (only the state after 10 was kept), so it hits nothing and records 6
    as its shared prefix's end; it keeps its own state after 6, which a third request sharing those 6
    tokens then hits."""
    manager, _ = prefill(0)
    second = Request("b", [*range(6), *range(60, 67)], 2)
    assert schedule(manager, second, 6) == 0
    assert second.shared_prefix_boundary == 6
    schedule(manager, second, 7)
    manager.free(second)
    assert schedule(manager, Request("c", [*range(6), 70, 71], 2), 2) == 6
    manager.check_invariants()


def test_under_an_interval_of_0_only_the_chunk_ending_the_prefill_keeps_a_checkpoint() -> None:
    """A 14-token prompt in chunks of 8 and 6, 4-token Mamba blocks with a checkpoint block: with no
    interval the first chunk keeps its checkpoint (the state after 4 tokens, position 0); with 0 it
    keeps none (position 0 null, one block fewer), and the last chunk's (after 12, the prompt's) is
    cached in position 2 either way."""
    for retention, first_table in ((None, [1, 2]), (0, [0, 1])):
        manager = KVCacheManager(KVCacheConfig(16, [CHECKPOINTED], prefix_cache_retention_interval=retention))
        request = Request("a", list(range(14)), 4)
        schedule(manager, request, 8)
        assert manager.get_block_ids("a") == (first_table,)
        schedule(manager, request, 6)
        assert request.block_hashes[2] in cached_keys(manager, 0).values()
        manager.check_invariants()
