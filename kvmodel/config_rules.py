"""What the fields of a target configuration say of each other: the combinations vLLM's releases refuse
or assert on, and those kvcheck does not model."""

from __future__ import annotations

from typing import Protocol

from kvmodel.config_checks import ConfigError, is_int
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import kind_names
from kvmodel.limits import shown


class ConfigFields(Protocol):
    """What these rules read of a target configuration (:class:`kvmodel.config.TargetConfig`): its fields
    and the quantities derived from them."""

    @property
    def async_scheduling(self) -> bool: ...
    @property
    def block_size(self) -> int: ...
    @property
    def dcp_world_size(self) -> int: ...
    @property
    def defer_block_free(self) -> bool: ...
    @property
    def drafter_group_ids(self) -> frozenset[int]: ...
    @property
    def drop_group_ids(self) -> frozenset[int]: ...
    @property
    def eagle_group_ids(self) -> tuple[int, ...]: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def groups(self) -> tuple[GroupSpec, ...]: ...
    @property
    def hash_block_size(self) -> int | None: ...
    @property
    def hash_size(self) -> int: ...
    @property
    def hit_alignment(self) -> int: ...
    @property
    def num_encoder_tokens(self) -> int: ...
    @property
    def num_hash_lookahead_tokens(self) -> int: ...
    @property
    def num_prefill_lookahead(self) -> int: ...
    @property
    def num_reprefillable_tokens(self) -> int: ...
    @property
    def prefix_cache_retention_interval(self) -> int | None: ...
    @property
    def scheduler_block_size(self) -> int: ...
    @property
    def states_finer_than_hashes(self) -> bool: ...
    @property
    def use_eagle(self) -> bool: ...
    def dcp_sharded(self, group_id: int) -> bool: ...
    def group_block_size(self, group_id: int) -> int: ...


def check_fields_together(config: ConfigFields) -> None:
    """Refuse the first group out of range, then the first combination of fields that do not go together,
    raising :class:`ConfigError` naming the field."""
    for index, group in enumerate(config.groups):
        if not isinstance(group, GroupSpec):
            raise ConfigError(f"groups[{index}]", f"must be a group spec, got {shown(group)}")
        group.validate(config.block_size, f"groups[{index}]")
    for index, group_id in enumerate(config.eagle_group_ids):
        if not is_int(group_id) or not 0 <= group_id < len(config.groups):
            raise ConfigError(
                f"eagle_group_ids[{index}]",
                f"must name one of the {len(config.groups)} groups, got {shown(group_id)}",
            )
    if len(set(config.eagle_group_ids)) != len(config.eagle_group_ids):
        raise ConfigError("eagle_group_ids", f"names a group twice: {list(config.eagle_group_ids)}")
    if config.use_eagle and config.num_hash_lookahead_tokens:
        raise ConfigError(
            "num_hash_lookahead_tokens",
            f"{config.num_hash_lookahead_tokens} with use_eagle true: hashes that look ahead replace the EAGLE "
            "drop (vLLM's scheduler turns the drop off)",
        )
    checkpointed = [i for i, group in enumerate(config.groups) if group.prefill_checkpoint_alignment is not None]
    if checkpointed and config.async_scheduling and config.num_hash_lookahead_tokens:
        raise ConfigError(
            f"groups[{checkpointed[0]}].prefill_checkpoint_alignment",
            "prefill checkpoints with async scheduling and hashes that look ahead: vLLM 0.33.0 places a "
            "step's checkpoint past the hashes of a request whose step reaches a token still being sampled, "
            "and asserts (tests/vllm/test_known_defects.py)",
        )
    has_cross = any(group.rules.encoder_blocks for group in config.groups)
    encoder = config.num_encoder_tokens
    encoder_kinds = kind_names(lambda kind: kind.encoder_blocks)
    if has_cross and encoder == 0:
        raise ConfigError("num_encoder_tokens", f"a {encoder_kinds} group needs the encoder's token count (>= 1)")
    if encoder and not has_cross:
        raise ConfigError("num_encoder_tokens", f"{encoder} without a {encoder_kinds} group to hold them")
    if config.defer_block_free and not config.async_scheduling:
        raise ConfigError("defer_block_free", "true needs async_scheduling true: only steps in flight defer a free")
    if config.enable_caching:
        for index, group in enumerate(config.groups):
            reason = group.rules.caching_off_reason
            if reason is not None:
                raise ConfigError("enable_caching", f"true with groups[{index}] {group.kind}: {reason}")
        if len(config.groups) > 1 and not any(group.rules.in_prefix_cache for group in config.groups):
            raise ConfigError(
                "enable_caching",
                "true with no group in the prefix cache: a hybrid cache needs one (vLLM 0.33.0 asserts on it)",
            )
        for index in sorted(config.drop_group_ids):
            if config.groups[index].rules.chunked:
                raise ConfigError(
                    "use_eagle",
                    f"true with groups[{index}] {config.groups[index].kind} holding the drafter: a chunked-local "
                    "hit cannot drop a block (vLLM 0.33.0 asserts on it)",
                )
        if config.drafter_group_ids and config.scheduler_block_size < config.num_prefill_lookahead:
            raise ConfigError(
                "num_prefill_lookahead",
                f"{config.num_prefill_lookahead} is above the scheduler block size {config.scheduler_block_size}: "
                "with prefix caching a drafter's prefill lookahead must fit in a hit's last block (vLLM 0.33.0 "
                "refuses it)",
            )
    _check_context_parallel(config)
    _check_block_sizes(config)
    _check_retention_interval(config)
    _check_aligned_mamba(config)


def _check_aligned_mamba(config: ConfigFields) -> None:
    """Refuse what kvcheck does not model beside a ``mamba_align`` group (nor kvcore implements)."""
    if not config.enable_caching:
        return
    for index, group in enumerate(config.groups):
        if not group.rules.aligned_states:
            continue
        if config.states_finer_than_hashes and index in config.drop_group_ids and config.num_reprefillable_tokens:
            raise ConfigError(
                "num_prefill_lookahead",
                f"{config.num_prefill_lookahead} with groups[{index}] mamba_align in blocks larger than the hashes "
                "holding the drafter: vLLM 0.33.0 then keys the prompt's state inside a block a step late, "
                "after the forward that runs past it (tests/vllm/test_known_defects.py); name the drafter's "
                "groups without it, or a lookahead of 1",
            )


def _check_context_parallel(config: ConfigFields) -> None:
    """Refuse the world sizes vLLM 0.33.0 refuses: with prefix caching, sharded groups other than full
    attention in a hybrid cache, and one sharded local-attention group."""
    world = config.dcp_world_size
    if world == 1 or not config.enable_caching:
        return
    for index, group in enumerate(config.groups):
        if not config.dcp_sharded(index) or group.rules.full_hit:
            continue
        if len(config.groups) > 1:
            raise ConfigError(
                "dcp_world_size",
                f"{world} with prefix caching and groups[{index}] {group.kind} sharded: a hybrid cache shards "
                "only full-attention groups (vLLM 0.33.0 asserts on it; mark it dcp_replicated)",
            )
        if group.rules.local_attention:
            raise ConfigError(
                "dcp_world_size",
                f"{world} with prefix caching and one {group.kind} group: vLLM 0.33.0 looks its hits up only "
                "unsharded (it asserts at the first lookup)",
            )


def _check_retention_interval(config: ConfigFields) -> None:
    """Refuse the retention intervals vLLM 0.33.0's coordinator refuses."""
    interval = config.prefix_cache_retention_interval
    if interval is None:
        return
    if interval and not any(group.rules.sliding or group.rules.holds_state for group in config.groups):
        raise ConfigError(
            "prefix_cache_retention_interval",
            f"{interval} with no sliding-window or Mamba group: retention thins only theirs (vLLM 0.33.0 "
            "refuses it; 0 is accepted)",
        )
    if interval % config.scheduler_block_size:
        raise ConfigError(
            "prefix_cache_retention_interval",
            f"{interval} is not a multiple of the scheduler block size {config.scheduler_block_size} (vLLM 0.33.0 "
            "refuses it)",
        )


def _check_block_sizes(config: ConfigFields) -> None:
    """Refuse the hash granularity vLLM 0.33.0 refuses, and what kvcheck does not model of mixed sizes."""
    hashing = config.hash_block_size
    if hashing is not None and config.scheduler_block_size % hashing:
        raise ConfigError(
            "hash_block_size",
            f"{hashing} does not divide the scheduler block size {config.scheduler_block_size} (vLLM 0.33.0 "
            "asserts on it)",
        )
    if not config.enable_caching:
        return
    hashing = config.hash_size
    for index, group in enumerate(config.groups):
        size = config.group_block_size(index)
        if len(config.groups) == 1 and hashing != size:
            raise ConfigError(
                "hash_block_size",
                f"{hashing} with one group of block_size {size}: with prefix caching one group's hits land on "
                "its blocks (vLLM 0.33.0 refuses it)",
            )
        if group.rules.in_prefix_cache and size % hashing:
            raise ConfigError(
                "hash_block_size",
                f"{hashing} does not divide groups[{index}]'s block_size {size}: every group in the prefix cache "
                "must hash at a divisor of its block size (vLLM 0.33.0 asserts on it)",
            )
        if group.rules.chunked and len(config.groups) > 1 and size != config.hit_alignment:
            raise ConfigError(
                f"groups[{index}].block_size",
                f"{size} is not the hits' alignment {config.hit_alignment} (the scheduler block size, or the "
                "hash size with sub-block hits): chunked-local hits align to its own blocks (vLLM 0.33.0 "
                "asserts at the first lookup)",
            )
        if group.rules.scratch_block and size != hashing:
            raise ConfigError(
                f"groups[{index}].block_size",
                f"{size} with prefix caching and hashes of {hashing} tokens: vLLM 0.33.0 enters the ring's scratch "
                "block in the prefix cache under a partial key (not modelled)",
            )
