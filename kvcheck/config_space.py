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

import random
from typing import TypedDict

import attrs

from kvcheck.config_features import (
    block_sizes,
    context_parallel,
    drafter_beside_states,
    mixed_precision,
    prefill_checkpoints,
    retention_interval,
    shared_prefix_checkpoints,
    state_retention,
    wider_states,
)
from kvcheck.kinds import BESIDE_STATES_DRAWS, MIXED_DRAWS
from kvcheck.kinds.chunked_local import CHUNKED_LOCAL
from kvcheck.kinds.cross_attention import CROSS_ATTENTION
from kvcheck.kinds.full import FULL, MLA
from kvcheck.kinds.mamba import ALIGN, MAMBA
from kvcheck.kinds.ring import RING
from kvcheck.kinds.rswa import RSWA
from kvcheck.kinds.sliding_window import SLIDING_WINDOW, SLIDING_WINDOW_MLA
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import CACHING_OFF_KINDS


class _Admission(TypedDict, total=False):
    """The admission gate of a draw (at most one) and the encoder's length: keyword arguments of
    :class:`TargetConfig`."""

    reserve_full_sequence: bool
    max_in_flight_tokens: int | None
    reserved_blocks: int
    watermark: float
    num_encoder_tokens: int


def _local_group(rng: random.Random, block_size: int) -> GroupSpec:
    """A local-attention group with a window a few blocks long, as in shipped hybrid models."""
    kind = SLIDING_WINDOW if rng.random() < 0.5 else CHUNKED_LOCAL
    return kind.draw_short(rng, block_size)


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
        return (FULL.group(), *(_local_group(rng, block_size),) * (count - 1)), None
    if layout == "llama":
        return (FULL.group(), *(_local_group(rng, block_size) for _ in range(count - 1))), None
    if layout == "rswa":
        # A multimodal model with R-SWA layers beside full attention; with one group, its R-SWA layers alone.
        if count == 1:
            return (RSWA.draw_short(rng, block_size),), None
        return (FULL.group(), *(RSWA.draw_short(rng, block_size),) * (count - 1)), None
    if layout == "deepseek":
        # MLA layers, and an EAGLE drafter's full-attention layers in a group of their own; in half the
        # draws with room, sliding-window MLA layers too (DeepSeek V4).
        main = [MLA.group()] * (count - 1)
        if count > 2 and rng.random() < 0.5:
            main[-1] = SLIDING_WINDOW_MLA.draw_short(rng, block_size)
        return (*main, FULL.group()), count - 1
    if layout == "compressed":
        # Full attention, the compressor's ring buffer, and possibly local layers.
        return (
            FULL.group(),
            RING.group(),
            *(_local_group(rng, block_size) for _ in range(count - 2)),
        ), None
    if layout == "mamba":
        # Jamba, Nemotron-H, Granite 4, Qwen3-Next without prefix caching: attention layers, then Mamba
        # layers split into groups of one spec; with one group, a pure Mamba model (Mamba 2).
        if count == 1:
            return (MAMBA.draw(rng, block_size),), None
        return (FULL.group(), *(MAMBA.draw(rng, block_size),) * (count - 1)), None
    if layout == "samba":
        # Samba's Mamba and sliding-window layers; with three groups or more, full attention first too
        # (Phi-4-mini-flash).
        window = _window_beside_states(rng, block_size)
        if count == 2:
            return (window, MAMBA.draw(rng, block_size)), None
        return (FULL.group(), window, *(MAMBA.draw(rng, block_size),) * (count - 2)), None
    if layout == "encoder_decoder":
        # Whisper: decoder self-attention and cross-attention, without prefix caching.
        return (*(FULL.group(),) * (count - 1), CROSS_ATTENTION.group()), None
    return tuple(rng.choice(MIXED_DRAWS).draw(rng, block_size) for _ in range(count)), None


def _window_beside_states(rng: random.Random, block_size: int) -> GroupSpec:
    """Local attention beside Mamba states: a sliding window or a chunked-local group, in blocks of
    the cache's block size or twice that, or (in half the draws) R-SWA in blocks twice that.  Where the
    hashes are the cache's block size, a group in blocks twice that is hashed finer than its blocks:
    with align-mode Mamba states in larger blocks than the hashes, a sliding window or chunked-local
    group so hashed turns sub-block hits off (vLLM 0.33.0), while R-SWA looks up inside its blocks as
    full attention does."""
    # R-SWA in half the draws: its hits inside its blocks need sub-block hits on as well.
    kind = rng.choice(BESIDE_STATES_DRAWS)
    wide = rng.random() < 1 / 2 or kind.wide_beside_states
    size = (2 if wide else 1) * block_size
    return attrs.evolve(kind.draw_short(rng, size), block_size=size if wide else None)


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
        groups = tuple(attrs.evolve(group, kind=ALIGN.name) if group.kind == MAMBA.name else group for group in groups)
    if encoder_decoder or any(group.kind in CACHING_OFF_KINDS for group in groups):
        enable_caching = False
    elif enable_caching and count > 1 and all(not group.rules.in_prefix_cache for group in groups):
        # vLLM needs a group in the prefix cache when it is on (none of the kinds left out of it but a ring
        # buffer runs with caching on).
        groups = (FULL.group(), *groups[1:])
    num_encoder_tokens = rng.randint(1, 3 * block_size) if encoder_decoder else 0
    # An EAGLE drafter in half the runs with caching on (its drop only shapes
    # prefix hits; drawn after the rest, so the configuration is otherwise the
    # same); vLLM refuses it beside a chunked-local group while caching is on.
    eagle_drawn = rng.random() < 1 / 2 or layout == "deepseek"
    # A draft model has no Mamba layers.
    can_drop = [index for index, group in enumerate(groups) if not (group.rules.chunked or group.rules.aligned_states)]
    # Beside a chunked-local group the drafter sits in other groups only
    # (vLLM cannot drop a chunked-local hit), as an EAGLE head beside Llama 4's layers.
    # (Beside an align-mode Mamba group the drafter is drawn last: config_features.drafter_beside_states.)
    aligned_mamba = any(group.rules.aligned_states for group in groups)
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
        if hash_lookahead > 1 and any(group.kind != FULL.name for group in groups):
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
    config = retention_interval(rng, block_sizes(rng, config, block_sizes_share), retention_share)
    config = wider_states(rng, context_parallel(rng, config, dcp_share), sub_block_share)
    config = mixed_precision(rng, config, mixed_precision_share)
    config = prefill_checkpoints(rng, config, checkpoint_share)
    config = state_retention(rng, config, state_retention_share)
    config = drafter_beside_states(rng, config, drafter_beside_states_share)
    return shared_prefix_checkpoints(rng, config, shared_prefix_checkpoint_share)
