"""Decode context parallelism: a sharded group's blocks hold ``block_size * dcp_world_size`` tokens.

The expected sizes, hits and refusals are the ones vLLM 0.33.0 gives for the same configuration.
"""

from __future__ import annotations

import pytest

from kvcore import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    InvalidConfig,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    RSWASpec,
    SlidingWindowSpec,
)
from tests.kvcore.steps import run_step, tokens


def manager_block_sizes(manager: KVCacheManager) -> list[int]:
    return [group_manager.block_size for group_manager in manager.coordinator.managers]


def test_a_sharded_group_holds_world_size_times_its_tokens_per_block() -> None:
    config = KVCacheConfig(16, (FullAttentionSpec(2),), dcp_world_size=4)
    assert (config.scheduler_block_size, config.hash_block_size) == (8, 8)
    manager = KVCacheManager(config)
    assert manager_block_sizes(manager) == [8]
    request = Request("a", tokens(0, 9), config.hash_block_size)
    run_step(manager, request)
    assert len(manager.get_block_ids("a")[0]) == 2  # 9 tokens in blocks of 8


def test_a_hit_lands_on_the_sharded_block_size() -> None:
    config = KVCacheConfig(16, (FullAttentionSpec(2),), dcp_world_size=2)
    manager = KVCacheManager(config)
    run_step(manager, Request("a", tokens(0, 12), 4))
    manager.free("a")
    # Tokens 0..9 are shared: two whole 4-token blocks hit.
    assert run_step(manager, Request("b", [*tokens(0, 10), 99, 99], 4)) == 8
    manager.check_invariants()


def test_a_replicated_draft_group_keeps_its_block_size_and_its_own_lookup() -> None:
    """MLA sharded over 2 ranks beside a draft model's replicated full attention: blocks of 4 and of 2
    tokens, hashes of 2, hits on 4; the two specs are looked up apart, and only the drafter's drops."""
    config = KVCacheConfig(
        32,
        (MLAAttentionSpec(2), FullAttentionSpec(2)),
        use_eagle=True,
        eagle_group_ids=(1,),
        dcp_world_size=2,
        dcp_replicated_group_ids=(1,),
    )
    assert config.manager_block_sizes == (4, 2)
    assert (config.scheduler_block_size, config.hash_block_size) == (4, 2)
    manager = KVCacheManager(config)
    spec_groups = manager.coordinator.spec_groups  # type: ignore[attr-defined]
    assert [(sg.group_ids, sg.drops) for sg in spec_groups] == [([0], False), ([1], True)]
    run_step(manager, Request("a", tokens(0, 12), 2))
    manager.free("a")
    # 12 cached tokens, the drafter drops its last 2-token block, hits land on 4: 8.
    assert run_step(manager, Request("b", tokens(0, 12), 2)) == 8
    manager.check_invariants()


def test_two_full_attention_groups_of_one_size_but_different_sharding_are_looked_up_apart() -> None:
    """Sharded blocks of 1 x 2 tokens and replicated blocks of 2 tokens are the same size, yet two specs."""
    config = KVCacheConfig(
        16, (FullAttentionSpec(1), FullAttentionSpec(2)), dcp_world_size=2, dcp_replicated_group_ids=(1,)
    )
    assert config.manager_block_sizes == (2, 2)
    spec_groups = KVCacheManager(config).coordinator.spec_groups  # type: ignore[attr-defined]
    assert [sg.group_ids for sg in spec_groups] == [[0], [1]]


def test_a_mamba_state_is_never_sharded() -> None:
    config = KVCacheConfig(16, (FullAttentionSpec(2), MambaSpec(2)), enable_caching=False, dcp_world_size=2)
    assert config.manager_block_sizes == (4, 2)
    assert config.scheduler_block_size == 4
    with pytest.raises(InvalidConfig, match="never sharded") as refused:
        KVCacheConfig(16, (MambaSpec(2),), enable_caching=False, dcp_world_size=2, dcp_replicated_group_ids=(0,))
    assert refused.value.field == "dcp_replicated_group_ids"


def test_the_window_admission_cap_counts_blocks_of_one_rank() -> None:
    """vLLM 0.33.0 sizes the cap from the spec, per rank: a 5-token window and 4 tokens in flight cap a
    request at ceil(8 / 2) + 1 = 5 blocks, though its blocks hold 4 tokens over 2 ranks."""
    config = KVCacheConfig(
        32, (SlidingWindowSpec(2, 5),), enable_caching=False, dcp_world_size=2, max_in_flight_tokens=4
    )
    manager = KVCacheManager(config)
    assert manager.coordinator.managers[0].max_admission_blocks == 5


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ((FullAttentionSpec(2), SlidingWindowSpec(2, 4)), "groups\\[1\\] is sliding_window: a hybrid prefix cache"),
        ((FullAttentionSpec(2), ChunkedLocalAttentionSpec(2, 4)), "groups\\[1\\] is chunked_local"),
        ((SlidingWindowSpec(2, 4),), "finds only unsharded"),
        ((ChunkedLocalAttentionSpec(2, 4),), "finds only unsharded"),
    ],
)
def test_with_prefix_caching_only_full_attention_is_sharded(groups: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidConfig, match=message) as refused:
        KVCacheConfig(16, groups, dcp_world_size=2)  # type: ignore[arg-type]
    assert refused.value.field == "dcp_world_size"


@pytest.mark.parametrize(
    "config_kwargs",
    [
        {"groups": (FullAttentionSpec(2), SlidingWindowSpec(2, 4)), "dcp_replicated_group_ids": (1,)},
        {"groups": (FullAttentionSpec(2), RSWASpec(2, 2), MLAAttentionSpec(2))},
        {"groups": (FullAttentionSpec(2), SlidingWindowSpec(2, 4)), "enable_caching": False},
        {"groups": (RSWASpec(2, 2),)},
    ],
)
def test_what_vllm_accepts_under_context_parallelism_kvcore_accepts(config_kwargs: dict[str, object]) -> None:
    KVCacheManager(KVCacheConfig(16, dcp_world_size=2, **config_kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config_kwargs", "field"),
    [
        ({"dcp_world_size": 0}, "dcp_world_size"),
        ({"dcp_replicated_group_ids": (2,)}, "dcp_replicated_group_ids[0]"),
        ({"dcp_replicated_group_ids": (0, 0)}, "dcp_replicated_group_ids"),
    ],
)
def test_bad_context_parallel_fields_are_refused_by_name(config_kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        KVCacheConfig(16, (FullAttentionSpec(2),), **config_kwargs)  # type: ignore[arg-type]
    assert refused.value.field == field
