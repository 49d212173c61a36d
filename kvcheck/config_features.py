"""The features a drawn configuration gets last, each from its own draws after the rest of the configuration.

:func:`kvcheck.config_space.random_config` draws the layout, the pool, caching, the drafter, async
scheduling and admission first, then hands the configuration through these in a fixed order: block
sizes, a retention interval, decode context parallelism, wider state blocks, mixed precision, prefill
checkpoints, state retention, a drafter beside Mamba states and shared-prefix checkpoints.  Each draws
after the ones before it, so a feature added at the end leaves every earlier draw as it was; a draw
vLLM would refuse (or kvcheck does not model) keeps the configuration it was given.
"""

from __future__ import annotations

import math
import random

import attrs

from kvmodel.config import TargetConfig
from kvmodel.config_checks import ConfigError
from kvmodel.kinds import MAMBA_KINDS, SLIDING_KINDS, UNCACHED_KINDS


def shared_prefix_checkpoints(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the draws where vLLM 0.33.0 lets them be in force (a drafter's
    groups, sub-block hits, no tokens a drafter prefills again), shared-prefix checkpoints: align-mode
    Mamba groups cache the state at the end of a prefix a lookup found shared, where the prefill chunk
    stops.  (Drawn last.)"""
    candidate = attrs.evolve(config, enable_mamba_shared_prefix_checkpoint=True)
    if not candidate.shared_prefix_checkpoint or rng.random() >= share:
        return config
    return candidate


def drafter_beside_states(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the hybrid draws with align-mode Mamba groups and no drafter
    yet, an EAGLE drafter whose layers sit in the attention groups (a draft model has no Mamba layers;
    in a third of those no group is named, so vLLM counts every group the drafter's):
    its drop shapes the attention groups' hits and moves the Mamba groups' reusable states and prefill
    checkpoints a hit boundary lower (with sub-block hits, a hash block lower), and it may prefill 1 to
    3 tokens past a chunk.  (Drawn last.)"""
    if not config.has_aligned_mamba or config.use_eagle or config.num_hash_lookahead_tokens:
        return config
    attention = tuple(index for index, group in enumerate(config.groups) if group.kind not in MAMBA_KINDS)
    if not attention or rng.random() >= share:
        return config
    prefill_lookahead = min(rng.choice([0, 1, 2, 3]), config.block_size)
    # In a third of the draws no group is named: vLLM then counts every group the drafter's, the Mamba
    # groups too, whose lookups still look no further than the candidate.
    drafter_groups = attention if rng.random() < 2 / 3 else ()
    if not drafter_groups and config.states_finer_than_hashes:
        # A Mamba group holding the drafter, in blocks larger than the hashes, takes no lookahead past one
        # token: vLLM 0.33.0 keys the prompt's state inside a block a step late (tests/vllm/test_known_defects.py).
        prefill_lookahead = min(prefill_lookahead, 1)
    drafter = attrs.evolve(
        config, use_eagle=True, eagle_group_ids=drafter_groups, num_prefill_lookahead=prefill_lookahead
    )
    try:
        return drafter.validate()
    except ConfigError:
        return config


def state_retention(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the draws with align-mode Mamba groups, a retention interval
    (vLLM's sparse state retention): 0 (only the states at replay boundaries and shared prefixes' ends,
    and prefill checkpoints on the chunk ending the prefill only) or two to eight scheduler blocks.
    (Drawn last.)"""
    if not config.has_aligned_mamba or config.prefix_cache_retention_interval is not None or rng.random() >= share:
        return config
    interval = rng.choice([0, 0, 2, 4, 8]) * config.scheduler_block_size
    return attrs.evolve(config, prefix_cache_retention_interval=interval).validate()


def prefill_checkpoints(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the draws with align-mode Mamba groups, a prefill checkpoint
    block in every one of them (as Qwen3-Next's and Nemotron-H's Mamba layers declare), on an alignment
    of 1 token (a backend exporting any position), the hash size, twice it, or 3 tokens (one that
    misses some checkpoints); not with async scheduling and hashes that look ahead, where vLLM 0.33.0
    asserts.  (Drawn last.)"""
    if not config.has_aligned_mamba or rng.random() >= share:
        return config
    alignment = rng.choice([1, 1, config.hash_size, 2 * config.hash_size, 3])
    if config.async_scheduling and config.num_hash_lookahead_tokens:
        return config  # a vLLM 0.33.0 defect (tests/vllm/test_known_defects.py)
    groups = tuple(
        attrs.evolve(group, prefill_checkpoint_alignment=alignment) if group.rules.aligned_states else group
        for group in config.groups
    )
    return attrs.evolve(config, groups=groups).validate()


def mixed_precision(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the draws with two attention groups or more, the KV cache of
    the last ones (one group, or every group from a drawn one on) in fp8: attention groups of two dtypes,
    whose new blocks the worker zeroes.  (Drawn last.)"""
    attention = [index for index, group in enumerate(config.groups) if group.kind not in MAMBA_KINDS]
    if len(attention) < 2 or rng.random() >= share:
        return config
    first = rng.choice(attention[1:])
    groups = tuple(
        attrs.evolve(group, kv_cache_dtype="fp8") if index in attention and index >= first else group
        for index, group in enumerate(config.groups)
    )
    return attrs.evolve(config, groups=groups).validate()


def wider_states(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the hybrid draws with align-mode Mamba groups of the cache's
    block size, those groups' blocks twice as large as the attention blocks and the hashes: hits may
    then end inside a state block (vLLM's fine-grained hits).  (Drawn last.)"""
    widened = [
        index for index, group in enumerate(config.groups) if group.rules.aligned_states and group.block_size is None
    ]
    if len(config.groups) == 1 or not widened or rng.random() >= share:
        return config
    groups = tuple(
        attrs.evolve(group, block_size=2 * config.block_size) if index in widened else group
        for index, group in enumerate(config.groups)
    )
    try:
        return attrs.evolve(config, groups=groups).validate()
    except ConfigError:
        return config


STATES_UNDER_DCP_SHARE = 1 / 2
"""Of the draws with prefix caching and align-mode Mamba states that ``_context_parallel`` would shard,
the share it does, over 2 ranks (the states' other features keep most of their single-rank draws)."""


def context_parallel(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` sharded over 2 or 4 decode context parallel ranks in a ``share`` of the draws (twice
    that share of the draws with prefix caching that vLLM shards and that hold no align-mode Mamba
    group: every group full attention, as in DeepSeek's layouts, which DCP serves; few hybrid ones are;
    half of it with prefix caching beside align-mode Mamba states, where sub-block hits end inside
    the sharded blocks, and over 2 ranks there), the drafter's groups replicated in half of those (a
    draft model at DCP 1).
    (Drawn last.)  A draw vLLM would refuse (with prefix caching, a sharded group that is not full
    attention) keeps one rank."""
    states_cached = config.enable_caching and config.has_aligned_mamba
    if config.enable_caching and not states_cached and _shardable(config):
        share = min(1.0, 2 * share)
    draw = rng.random()
    if draw >= share:
        return config
    world = rng.choice([2, 2, 4])
    if states_cached:
        world = 2  # smaller sharded blocks: a request fits more often with a hit ending inside one
    groups = config.groups
    if config.eagle_group_ids and rng.random() < 1 / 2:
        groups = tuple(
            attrs.evolve(group, dcp_replicated=True) if index in config.eagle_group_ids else group
            for index, group in enumerate(groups)
        )
    if states_cached and draw >= share * STATES_UNDER_DCP_SHARE:
        return config
    try:
        return attrs.evolve(config, groups=groups, dcp_world_size=world).validate()
    except ConfigError:
        return config


def _shardable(config: TargetConfig) -> bool:
    """Whether vLLM accepts ``config`` over 2 decode context parallel ranks."""
    try:
        attrs.evolve(config, dcp_world_size=2).validate()
    except ConfigError:
        return False
    return True


def retention_interval(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the draws with caching and a sliding window (in half as much
    again of those with a sliding window alone: few single-group draws have one), a retention interval:
    0 (only the replay boundaries and shared prefixes) or two to eight scheduler blocks.  (Drawn
    last.)"""
    if not config.enable_caching or not any(group.kind in SLIDING_KINDS for group in config.groups):
        return config
    if len(config.groups) == 1:
        share = min(1.0, 1.5 * share)
    if rng.random() >= share:
        return config
    # (One scheduler block would keep what no interval keeps: a hit may end on any of them.)
    interval = rng.choice([0, 0, 2, 4, 8]) * config.scheduler_block_size
    return attrs.evolve(config, prefix_cache_retention_interval=interval).validate()


def block_sizes(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of multi-group draws, some groups' blocks two or three times as
    large; and in a ``share`` of multi-group draws with caching, hashes finer than the blocks.  (Drawn
    last, so the rest of the configuration is the same draw.)  A draw vLLM would refuse, or kvcheck
    does not model, keeps the one block size."""
    if len(config.groups) == 1:
        return config
    mixed = rng.random() < share
    factor = rng.choice([2, 2, 3])
    larger = [rng.random() < 1 / 2 for _ in config.groups]
    finer = config.enable_caching and rng.random() < share
    groups = config.groups
    if mixed:
        groups = tuple(
            attrs.evolve(group, block_size=config.block_size * factor)
            if large and group.kind not in UNCACHED_KINDS
            else group
            for group, large in zip(groups, larger)
        )
    candidate = attrs.evolve(config, groups=groups)
    if finer:
        cacheable = [size for size, group in zip(candidate.block_sizes, groups) if group.kind not in UNCACHED_KINDS]
        divisors = [d for d in range(1, math.gcd(*cacheable)) if math.gcd(*cacheable) % d == 0]
        if divisors:
            candidate = attrs.evolve(candidate, hash_block_size=rng.choice(divisors))
    try:
        return candidate.validate()
    except ConfigError:
        return config
