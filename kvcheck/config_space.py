"""The small configurations every driver draws from: one distribution for the machines and the swarm.

Small pools (4..32 blocks of 1..4 tokens) shared by 1..4 groups of mixed
kinds.  One-token blocks are common: every computed block is then full and
cached, so the free queue fills with cached blocks, where reuse-order bugs
show.  Half the multi-group configurations are laid out like shipped hybrid
models: full attention first, then local layers whose short windows drop
blocks early (Gemma 3, Llama 4; in half of those, several local groups of
one spec, as vLLM splits Gemma 3's sliding-window layers), so a prefix hit
leaves some of each local group's blocks in the free queue; or R-SWA
layers (a multimodal model keeping its prompt and a window); or MLA
layers with an EAGLE drafter's full-attention layers in a group of their
own (DeepSeek); or a ring buffer beside full attention (a
compressed-attention model); or, with prefix caching off, full attention
and Mamba layers (Jamba, Nemotron-H, Granite 4, Qwen3-Next; without prefix
caching some reserve blocks for draft states, with it the Mamba groups run
vLLM's align mode, where states sit on block boundaries and are cached), or
(a quarter of those) Mamba beside local attention (Samba: Mamba and a
sliding window; Phi-4-mini-flash: full attention too), the local layers a
sliding window, chunked-local or R-SWA group, some in blocks twice as large
as the hashes (beside align-mode Mamba in larger blocks, a sliding window or
chunked-local group so hashed turns sub-block hits off, as vLLM does; R-SWA
takes them, as full attention does); or decoder self-attention and
cross-attention (Whisper, with its fixed encoder length).  One single-group
draw in eight is a pure Mamba model, and one in eight of the others an R-SWA
group alone.  The other configurations mix every kind but cross-attention
and Mamba freely.  Some pools split evenly among the
groups, so that a request taking an equal share in every group leaves no
block free: a full pool, where freed cached blocks are all there is to
allocate from.  Half the configurations with caching on serve an EAGLE
drafter, and a third reserve lookahead slots for a drafter's tokens in every
step.  A third schedule asynchronously (steps in flight), half of those
with deferred frees.  A drafter either drops a block from hits or (vLLM's
default with caching) hashes blocks with the tokens after them, and may sit
in some of the groups only.  Half the runs take the KV cache event stream
after every step.  One multi-group configuration in three gives some of its
groups blocks two or three times as large (hybrid models whose layers have
different page sizes, such as Gemma 4): hits then land on the scheduler
block size, and full-attention groups with blocks larger than the hashes
cache a prompt's last hash boundary inside a block (a partial entry).  One
multi-group configuration with caching in three hashes finer than its
blocks (vLLM's ``prefix_match_unit``), which brings partial entries too.
Half the configurations with caching and a sliding window set a retention
interval (vLLM's sparse checkpoints): the window then caches only what hits
at the interval's ends, the prompt's replay boundaries and shared prefixes'
ends need.
Half the draws with align-mode Mamba groups set a retention interval as well
(vLLM's sparse state retention): the groups then cache only the states a
later hit can resume from, and with an interval of 0 keep a prefill
checkpoint on the chunk that ends the prefill only.  Two thirds of the
hybrid draws with align-mode groups, without sub-block hits or a drafter,
serve an EAGLE drafter in the attention groups (in a third of those in
every group): the Mamba groups' checkpoints then sit a hit boundary lower.
Half the hybrid draws with align-mode Mamba groups give them blocks twice as
large as the attention blocks and the hashes: a hit may then end inside a
state block, whose shared block the request copies on write (vLLM's
fine-grained hits).
Three draws in ten shard their attention groups over 2 or 4 decode context
parallel ranks (a block then holds that many times its tokens), leaving the
drafter's groups whole in half of those (a draft model running at DCP 1);
with prefix caching, only where every sharded group is full attention, as
vLLM 0.33.0 requires.
"""

from __future__ import annotations

import math
import random
from typing import TypedDict

import attrs

from kvmodel.config import (
    CACHING_OFF_KINDS,
    MAMBA_KINDS,
    SLIDING_KINDS,
    UNCACHED_KINDS,
    ConfigError,
    GroupSpec,
    TargetConfig,
)


class _Admission(TypedDict, total=False):
    """The admission gate of a draw (at most one) and the encoder's length: keyword arguments of
    :class:`TargetConfig`."""

    reserve_full_sequence: bool
    max_in_flight_tokens: int | None
    reserved_blocks: int
    watermark: float
    num_encoder_tokens: int


def _any_group(rng: random.Random, block_size: int) -> GroupSpec:
    kind = rng.choice(["full", "mla", "sliding_window", "chunked_local", "rswa", "ring"])
    if kind == "sliding_window":
        # Short windows slide within a short run; long ones keep hits intact.  One in four is over
        # MLA's latent vectors (a spec of its own).
        if rng.random() < 1 / 4:
            kind = "sliding_window_mla"
        return GroupSpec(kind=kind, window=rng.randint(2, rng.choice([4, 16]) * block_size))
    if kind == "chunked_local":
        return GroupSpec(kind=kind, window=block_size * rng.randint(1, rng.choice([4, 16])))
    if kind == "rswa":
        return _rswa_group(rng, block_size)
    return GroupSpec(kind=kind)


def _rswa_group(rng: random.Random, block_size: int) -> GroupSpec:
    """An R-SWA group whose window of generated tokens is a few blocks at most, so the gap opens in a short run."""
    return GroupSpec(kind="rswa", window=rng.randint(1, block_size))


def _mamba_group(rng: random.Random) -> GroupSpec:
    """A Mamba group, reserving blocks for an MTP verifier's draft states in three draws in four."""
    return GroupSpec(kind="mamba", speculative_blocks=rng.choice([0, 1, 1, 2]))


def _local_group(rng: random.Random, block_size: int) -> GroupSpec:
    """A local-attention group with a window a few blocks long, as in shipped hybrid models."""
    if rng.random() < 0.5:
        return GroupSpec(kind="sliding_window", window=rng.randint(2, 4 * block_size))
    return GroupSpec(kind="chunked_local", window=block_size * rng.randint(1, 4))


SHIPPED_LAYOUTS = ("gemma", "llama", "rswa", "deepseek", "compressed", "mamba", "encoder_decoder")
"""Layouts shaped like shipped models (see the module's docstring); a quarter of the multi-group
``mamba`` draws are ``samba`` instead."""
LAYOUTS = ("mixed", *SHIPPED_LAYOUTS, "samba")
"""Every layout :func:`random_config` draws: ``mixed`` mixes the kinds freely."""
CACHING_OFF_LAYOUTS = ("encoder_decoder",)


def _layout_groups(
    rng: random.Random, layout: str, count: int, block_size: int
) -> tuple[tuple[GroupSpec, ...], int | None]:
    """The groups of ``layout`` with ``count`` groups, and the group an EAGLE drafter's layers sit in
    when the layout has one of their own."""
    if layout == "gemma":
        # vLLM splits Gemma 3's many sliding-window layers into several groups of one spec, looked up together.
        return (GroupSpec(kind="full"), *(_local_group(rng, block_size),) * (count - 1)), None
    if layout == "llama":
        return (GroupSpec(kind="full"), *(_local_group(rng, block_size) for _ in range(count - 1))), None
    if layout == "rswa":
        # A multimodal model with R-SWA layers beside full attention; with one group, its R-SWA layers alone.
        if count == 1:
            return (_rswa_group(rng, block_size),), None
        return (GroupSpec(kind="full"), *(_rswa_group(rng, block_size),) * (count - 1)), None
    if layout == "deepseek":
        # MLA layers, and an EAGLE drafter's full-attention layers in a group of their own; in half the
        # draws with room, sliding-window MLA layers too (DeepSeek V4).
        main = [GroupSpec(kind="mla")] * (count - 1)
        if count > 2 and rng.random() < 0.5:
            main[-1] = GroupSpec(kind="sliding_window_mla", window=rng.randint(2, 4 * block_size))
        return (*main, GroupSpec(kind="full")), count - 1
    if layout == "compressed":
        # Full attention, the compressor's ring buffer, and possibly local layers.
        return (
            GroupSpec(kind="full"),
            GroupSpec(kind="ring"),
            *(_local_group(rng, block_size) for _ in range(count - 2)),
        ), None
    if layout == "mamba":
        # Jamba, Nemotron-H, Granite 4, Qwen3-Next without prefix caching: attention layers, then Mamba
        # layers split into groups of one spec; with one group, a pure Mamba model (Mamba 2).
        if count == 1:
            return (_mamba_group(rng),), None
        return (GroupSpec(kind="full"), *(_mamba_group(rng),) * (count - 1)), None
    if layout == "samba":
        # Samba's Mamba and sliding-window layers; with three groups or more, full attention first too
        # (Phi-4-mini-flash).
        window = _window_beside_states(rng, block_size)
        if count == 2:
            return (window, _mamba_group(rng)), None
        return (GroupSpec(kind="full"), window, *(_mamba_group(rng),) * (count - 2)), None
    if layout == "encoder_decoder":
        # Whisper: decoder self-attention and cross-attention, without prefix caching.
        return (*(GroupSpec(kind="full"),) * (count - 1), GroupSpec(kind="cross_attention")), None
    return tuple(_any_group(rng, block_size) for _ in range(count)), None


def _window_beside_states(rng: random.Random, block_size: int) -> GroupSpec:
    """Local attention beside Mamba states: a sliding window or a chunked-local group, in blocks of
    the cache's block size or twice that, or (in half the draws) R-SWA in blocks twice that.  Where the
    hashes are the cache's block size, a group in blocks twice that is hashed finer than its blocks:
    with align-mode Mamba states in larger blocks than the hashes, a sliding window or chunked-local
    group so hashed turns sub-block hits off (vLLM 0.33.0), while R-SWA looks up inside its blocks as
    full attention does."""
    # R-SWA in half the draws: its hits inside its blocks need sub-block hits on as well.
    kind = rng.choice(["sliding_window", "chunked_local", "rswa", "rswa"])
    wide = rng.random() < 1 / 2 or kind == "rswa"
    size = (2 if wide else 1) * block_size
    if kind == "rswa":
        window = _rswa_group(rng, size)
    elif kind == "sliding_window":
        window = GroupSpec(kind=kind, window=rng.randint(2, 4 * size))
    else:
        window = GroupSpec(kind=kind, window=size * rng.randint(1, 4))
    return attrs.evolve(window, block_size=size if wide else None)


def _draw_layout(rng: random.Random, count: int) -> str:
    """Half the multi-group draws are shaped like shipped models; one single-group draw in eight is a
    pure Mamba model, and one in eight of the others an R-SWA group alone."""
    if count > 1 and rng.random() < 0.5:
        layout = rng.choices(SHIPPED_LAYOUTS, weights=(4, 4, 2, 2, 2, 3, 2))[0]
        return "samba" if layout == "mamba" and rng.random() < 1 / 4 else layout
    if count == 1 and rng.random() < 1 / 8:
        return "mamba"  # a pure Mamba model, in the align mode when caching is on
    if count == 1 and rng.random() < 1 / 8:
        return "rswa"
    return "mixed"


def random_config(
    rng: random.Random,
    num_groups: int | None = None,
    full_pool: bool = False,
    caching: bool | None = None,
    drafter_and_async: bool = True,
    layout: str | None = None,
    block_sizes_share: float = 1 / 3,
    retention_share: float = 1 / 2,
    dcp_share: float = 0.3,
    sub_block_share: float = 1 / 2,
    mixed_precision_share: float = 1 / 4,
    checkpoint_share: float = 1 / 2,
    state_retention_share: float = 1 / 2,
    drafter_beside_states_share: float = 2 / 3,
    shared_prefix_checkpoint_share: float = 1 / 3,
) -> TargetConfig:
    """A configuration drawn from ``rng``; ``num_groups`` fixes the group count, ``full_pool``
    makes the blocks split evenly among the groups, and ``caching`` fixes prefix caching on or off.
    Without ``drafter_and_async`` the same draws serve a plain model scheduled step by step (no
    drafter, lookahead or async scheduling), to measure what those features cost.  ``layout`` (one
    of :data:`LAYOUTS`) fixes the layout; a shipped layout needing more groups than drawn, or caching
    off where ``caching`` is on, falls back to ``mixed``.  ``block_sizes_share`` is the share of
    multi-group draws that give groups blocks of different sizes, and of those with caching that hash
    finer than their blocks (0: none; 1: every one vLLM accepts); ``retention_share`` the share of draws
    with caching and a sliding window that set a retention interval, ``dcp_share`` that of draws sharded
    over decode context parallel ranks, ``sub_block_share`` that of hybrid draws with align-mode Mamba
    groups whose state blocks are twice as large, ``mixed_precision_share`` that of draws with two
    attention groups or more that keep some groups' KV cache in fp8 (so new blocks are zeroed),
    ``checkpoint_share`` that of draws with align-mode Mamba groups that give them prefill checkpoints,
    ``state_retention_share`` that of those that thin the states they cache by a retention interval,
    ``drafter_beside_states_share`` that of those that serve an EAGLE drafter beside them,
    ``shared_prefix_checkpoint_share`` that of those where shared-prefix checkpoints can be in force
    (a drafter with sub-block hits) that turn them on; the draws are the same otherwise."""
    block_size = rng.choice([1, 1, 2, 2, 3, 4])
    count = num_groups or rng.randint(1, 4)
    if layout is None:
        layout = _draw_layout(rng, count)
    if layout == "samba":
        count = max(count, 2)  # Mamba beside local attention: two groups at least
    if (count == 1 and layout not in ("mixed", "mamba", "rswa")) or (caching and layout in CACHING_OFF_LAYOUTS):
        layout = "mixed"
    groups, drafter_group = _layout_groups(rng, layout, count, block_size)
    encoder_decoder = layout == "encoder_decoder"
    even_split = 1 + count * rng.randint(max(1, 3 // count), max(1, 31 // count))
    # Some pools are large enough for a long prefill to leave room after its
    # windows dropped blocks; tiny pools keep exhaustion frequent.
    num_blocks = even_split if full_pool else rng.choice([rng.randint(4, 32), rng.randint(16, 32), even_split])
    enable_caching = rng.random() < 0.5 if caching is None else caching
    if layout == "deepseek" and caching is None:
        # Served with prefix caching and its MTP drafter, which drops a block from the drafter group's hits.
        enable_caching = True
    if layout in ("mamba", "samba") and enable_caching:
        # Prefix caching of Mamba states: vLLM's align mode, with the same speculative blocks.
        groups = tuple(attrs.evolve(group, kind="mamba_align") if group.kind == "mamba" else group for group in groups)
    if encoder_decoder or any(group.kind in CACHING_OFF_KINDS for group in groups):
        enable_caching = False
    elif enable_caching and count > 1 and all(group.kind == "ring" for group in groups):
        # vLLM needs a group in the prefix cache when it is on.
        groups = (GroupSpec(kind="full"), *groups[1:])
    num_encoder_tokens = rng.randint(1, 3 * block_size) if encoder_decoder else 0
    # An EAGLE drafter in half the runs with caching on (its drop only shapes
    # prefix hits; drawn after the rest, so the configuration is otherwise the
    # same); vLLM refuses it beside a chunked-local group while caching is on.
    eagle_drawn = rng.random() < 1 / 2 or layout == "deepseek"
    # A draft model has no Mamba layers.
    can_drop = [index for index, group in enumerate(groups) if group.kind not in ("chunked_local", "mamba_align")]
    # Beside a chunked-local group the drafter sits in other groups only
    # (vLLM cannot drop a chunked-local hit), as an EAGLE head beside Llama 4's layers.
    # (Beside an align-mode Mamba group the drafter is drawn last: _drafter_beside_states.)
    aligned_mamba = any(group.kind == "mamba_align" for group in groups)
    use_eagle = eagle_drawn and enable_caching and bool(can_drop) and not aligned_mamba
    must_name_drafters = use_eagle and len(can_drop) < count
    # A drafter proposes a few tokens per step, and every step reserves slots for them.
    num_lookahead_tokens = rng.choice([1, 2, 3, 4]) if rng.random() < 1 / 3 else 0
    # Async scheduling in a third of the runs, with deferred frees (a KV-consumer connector) in half of those.
    async_scheduling = rng.random() < 1 / 3
    defer_block_free = async_scheduling and rng.random() < 1 / 2
    # vLLM's default drafter set-up with prefix caching: no drop, but block
    # hashes that look ahead as far as the drafter's prefill lookahead (1 for
    # EAGLE, k for k-module MTP).  With the drop (a KV connector), a prefill
    # lookahead of 1 to 3.  Half the multi-group drafters sit in some groups only.
    mode = rng.random()
    hash_lookahead = prefill_lookahead = 0
    if enable_caching and not use_eagle and mode < 1 / 3:
        hash_lookahead = prefill_lookahead = rng.choice([1, 1, 2, 3])
        if hash_lookahead > 1 and any(group.kind != "full" for group in groups):
            # vLLM 0.33.0's local-attention lookups index past the hashes then
            # (tests/vllm/test_known_defects.py): MTP's longer lookahead is
            # drawn for full-attention layouts only.
            hash_lookahead = prefill_lookahead = 1
    elif use_eagle and mode < 2 / 3:
        prefill_lookahead = rng.choice([1, 2, 3])
    eagle_group_ids: tuple[int, ...] = ()
    name_drafters = must_name_drafters or ((use_eagle or hash_lookahead) and count > 1 and rng.random() < 1 / 2)
    if drafter_group is not None and (use_eagle or hash_lookahead):
        eagle_group_ids = (drafter_group,)
    elif name_drafters and can_drop:
        eagle_group_ids = tuple(sorted(rng.sample(can_drop, rng.randint(1, len(can_drop)))))
    if eagle_group_ids or use_eagle:
        # vLLM refuses a drafter's prefill lookahead longer than a block.
        prefill_lookahead = min(prefill_lookahead, block_size)
        hash_lookahead = min(hash_lookahead, block_size)
    # The scheduler's admission of waiting requests, in a quarter of the runs,
    # one gate at a time: the whole request must fit (its window groups
    # capped by the tokens in flight), blocks reserved for other steps, or a
    # watermark.  (A gate on every warm start would refuse its resume.)
    admission: _Admission = {}
    if rng.random() < 1 / 4:
        gate = rng.choice(["full_sequence", "reserved", "watermark"])
        if gate == "full_sequence":
            admission = {"reserve_full_sequence": True, "max_in_flight_tokens": rng.choice([None, 1, 2, 4, 8])}
        elif gate == "reserved":
            admission = {"reserved_blocks": rng.randint(1, 3)}
        else:
            admission = {"watermark": rng.choice([0.1, 0.25])}
    if num_encoder_tokens:
        admission["num_encoder_tokens"] = num_encoder_tokens
    if not drafter_and_async:
        return TargetConfig(
            num_blocks=num_blocks, block_size=block_size, groups=groups, enable_caching=enable_caching, **admission
        )
    # The KV cache event stream in half the runs.
    enable_kv_cache_events = rng.random() < 1 / 2
    config = TargetConfig(
        num_blocks=num_blocks,
        block_size=block_size,
        groups=groups,
        enable_caching=enable_caching,
        use_eagle=use_eagle,
        num_lookahead_tokens=num_lookahead_tokens,
        async_scheduling=async_scheduling,
        defer_block_free=defer_block_free,
        num_hash_lookahead_tokens=hash_lookahead,
        num_prefill_lookahead=prefill_lookahead,
        eagle_group_ids=eagle_group_ids,
        **admission,
        enable_kv_cache_events=enable_kv_cache_events,
    )
    config = _retention_interval(rng, _block_sizes(rng, config, block_sizes_share), retention_share)
    config = _wider_states(rng, _context_parallel(rng, config, dcp_share), sub_block_share)
    config = _mixed_precision(rng, config, mixed_precision_share)
    config = _prefill_checkpoints(rng, config, checkpoint_share)
    config = _state_retention(rng, config, state_retention_share)
    config = _drafter_beside_states(rng, config, drafter_beside_states_share)
    return _shared_prefix_checkpoints(rng, config, shared_prefix_checkpoint_share)


def _shared_prefix_checkpoints(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the draws where vLLM 0.33.0 lets them be in force (a drafter's
    groups, sub-block hits, no tokens a drafter prefills again), shared-prefix checkpoints: align-mode
    Mamba groups cache the state at the end of a prefix a lookup found shared, where the prefill chunk
    stops.  (Drawn last.)"""
    candidate = attrs.evolve(config, enable_mamba_shared_prefix_checkpoint=True)
    if not candidate.shared_prefix_checkpoint or rng.random() >= share:
        return config
    return candidate


def _drafter_beside_states(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
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


def _state_retention(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the draws with align-mode Mamba groups, a retention interval
    (vLLM's sparse state retention): 0 (only the states at replay boundaries and shared prefixes' ends,
    and prefill checkpoints on the chunk ending the prefill only) or two to eight scheduler blocks.
    (Drawn last.)"""
    if not config.has_aligned_mamba or config.prefix_cache_retention_interval is not None or rng.random() >= share:
        return config
    interval = rng.choice([0, 0, 2, 4, 8]) * config.scheduler_block_size
    return attrs.evolve(config, prefix_cache_retention_interval=interval).validate()


def _prefill_checkpoints(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
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
        attrs.evolve(group, prefill_checkpoint_alignment=alignment) if group.kind == "mamba_align" else group
        for group in config.groups
    )
    return attrs.evolve(config, groups=groups).validate()


def _mixed_precision(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
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


def _wider_states(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
    """``config`` with, in a ``share`` of the hybrid draws with align-mode Mamba groups of the cache's
    block size, those groups' blocks twice as large as the attention blocks and the hashes: hits may
    then end inside a state block (vLLM's fine-grained hits).  (Drawn last.)"""
    widened = [
        index for index, group in enumerate(config.groups) if group.kind == "mamba_align" and group.block_size is None
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


def _context_parallel(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
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


def _retention_interval(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
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


def _block_sizes(rng: random.Random, config: TargetConfig, share: float) -> TargetConfig:
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
