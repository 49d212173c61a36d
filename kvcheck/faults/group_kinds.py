"""The ring buffer, cross-attention and MLA kinds: each given another kind's manager, count or lookup."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import kvcore
from kvcheck.faults.fault import Family, FaultDeclaration, VllmPlant
from kvcheck.faults.rewiring import borrow_method
from kvcore.coordinator import HybridCoordinator
from kvcore.managers import CircularBufferManager, FullAttentionManager
from kvcore.managers.base import HitBlocks

FAMILY = Family()


def plant_ring_grows_like_full_attention(manager: kvcore.KVCacheManager) -> None:
    # The bug: the ring's manager takes full attention's growth (a block per
    # block_size tokens) while still counting one block for admission: the ring
    # holds a block per block of tokens, admitted against a count that says one.
    borrow_method(manager.coordinator.managers, CircularBufferManager, "allocate_new_blocks", FullAttentionManager)


def plant_ring_grows_like_full_attention_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import CircularBufferManager, FullAttentionManager

    managers = manager.coordinator.single_type_managers
    borrow_method(managers, CircularBufferManager, "allocate_new_blocks", FullAttentionManager)


FAMILY.declare(
    FaultDeclaration(
        number=25,
        name="ring-grows-like-full-attention",
        description=(
            "the ring buffer's manager grows like full attention (a block per block of tokens) "
            "while admission counts one block"
        ),
        kvcore=plant_ring_grows_like_full_attention,
        vllm=VllmPlant(
            number=15,
            description=("vLLM CircularBufferManager allocating like full attention while counting one block"),
            plant=plant_ring_grows_like_full_attention_in_vllm,
        ),
    )
)


def plant_cross_attention_counted_by_decoder_tokens(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    count_blocks = coordinator.num_blocks_to_allocate

    def num_blocks_to_allocate(
        request_id: str,
        num_tokens: int,
        new_computed_blocks: HitBlocks,
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        num_local_computed_tokens: int | None = None,
        **more: Any,
    ) -> int:
        # The bug: cross-attention's blocks are counted like every other
        # group's, for the decoder's tokens, while they are allocated for the
        # encoder's: admission refuses steps that fit, or admits ones that don't.
        return count_blocks(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            apply_admission_cap,
            num_tokens,
            num_tokens_main_model,
            num_local_computed_tokens,
            **more,
        )

    # The planted copy takes the trailing options as keywords (**more).
    coordinator.num_blocks_to_allocate = num_blocks_to_allocate  # type: ignore[method-assign, assignment]


def plant_cross_attention_counted_by_decoder_tokens_in_vllm(manager: Any) -> None:
    coordinator = manager.coordinator
    count_blocks: Callable[..., int] = coordinator.get_num_blocks_to_allocate

    def blocks_for_decoder_tokens(**kwargs: Any) -> int:
        # The bug: cross-attention's blocks are counted for the decoder's tokens.
        return count_blocks(**{**kwargs, "num_encoder_tokens": kwargs["num_tokens"]})

    coordinator.get_num_blocks_to_allocate = blocks_for_decoder_tokens


FAMILY.declare(
    FaultDeclaration(
        number=26,
        name="cross-attention-counted-by-decoder-tokens",
        description="admission counts cross-attention's blocks for the decoder's tokens, not the encoder's",
        kvcore=plant_cross_attention_counted_by_decoder_tokens,
        vllm=VllmPlant(
            number=16,
            description="vLLM's coordinator counting cross-attention's blocks for the decoder's tokens",
            plant=plant_cross_attention_counted_by_decoder_tokens_in_vllm,
        ),
    )
)


def plant_mla_looked_up_with_full_attention(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    if not isinstance(coordinator, HybridCoordinator):
        return
    # The bug: MLA's spec compares equal to full attention's (a comparison that ignores the spec's
    # type), so MLA layers are looked up and cached with full attention's, and drop a block from
    # their hits whenever a drafter's full-attention layers do.
    full = next((sg for sg in coordinator.spec_groups if type(sg.spec) is kvcore.FullAttentionSpec), None)
    mla = [sg for sg in coordinator.spec_groups if isinstance(sg.spec, kvcore.MLAAttentionSpec)]
    if full is None or not mla:
        return
    merged = attrs.evolve(
        full,
        group_ids=[*full.group_ids, *(g for sg in mla for g in sg.group_ids)],
        drops=full.drops or any(sg.drops for sg in mla),
    )
    kept = [sg for sg in coordinator.spec_groups if not isinstance(sg.spec, kvcore.MLAAttentionSpec)]
    coordinator.spec_groups = tuple(merged if sg is full else sg for sg in kept)
    coordinator.dropping_group_ids = frozenset(g for sg in coordinator.spec_groups if sg.drops for g in sg.group_ids)


def plant_mla_looked_up_with_full_attention_in_vllm(manager: Any) -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    coordinator = manager.coordinator
    groups = getattr(coordinator, "attention_groups", None)
    if groups is None:
        return
    full = next((g for g in groups if type(g.spec) is FullAttentionSpec), None)
    mla = [g for g in groups if isinstance(g.spec, MLAAttentionSpec)]
    if full is None or not mla:
        return
    merged = full._replace(
        group_ids=[*full.group_ids, *(i for g in mla for i in g.group_ids)],
        use_eagle=full.use_eagle or any(g.use_eagle for g in mla),
    )
    coordinator.attention_groups = [merged if g is full else g for g in groups if g not in mla]
    if merged.use_eagle:
        for group_id in merged.group_ids:
            coordinator.single_type_managers[group_id].use_eagle = True


FAMILY.declare(
    FaultDeclaration(
        number=29,
        name="mla-looked-up-with-full-attention",
        description=(
            "MLA's spec compares equal to full attention's: MLA layers are looked up with a "
            "drafter's full-attention layers and drop a block from their hits too"
        ),
        kvcore=plant_mla_looked_up_with_full_attention,
        vllm=VllmPlant(
            number=19,
            description=("vLLM's coordinator grouping MLA layers with full attention's for the hit lookup"),
            plant=plant_mla_looked_up_with_full_attention_in_vllm,
        ),
    )
)


def plant_sliding_window_mla_managed_as_mla(manager: kvcore.KVCacheManager) -> None:
    coordinator = manager.coordinator
    # The bug: the spec-to-manager table maps sliding-window MLA to MLA's manager (full
    # attention's), so its blocks never leave the window, its hits need every block, and
    # admission has no cap for it.
    for group_manager in coordinator.managers:
        if isinstance(group_manager.spec, kvcore.SlidingWindowMLASpec):
            group_manager.__class__ = FullAttentionManager
            group_manager.max_admission_blocks = None
    if isinstance(coordinator, HybridCoordinator):
        coordinator.spec_groups = tuple(
            attrs.evolve(sg, manager_class=FullAttentionManager)
            if isinstance(sg.spec, kvcore.SlidingWindowMLASpec)
            else sg
            for sg in coordinator.spec_groups
        )


def plant_sliding_window_mla_managed_as_mla_in_vllm(manager: Any) -> None:
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    coordinator = manager.coordinator
    for group_manager in coordinator.single_type_managers:
        if isinstance(group_manager.kv_cache_spec, SlidingWindowMLASpec):
            group_manager.__class__ = FullAttentionManager
            group_manager.max_admission_blocks_per_request = None
    groups = getattr(coordinator, "attention_groups", None)
    if groups is not None:
        coordinator.attention_groups = [
            g._replace(manager_cls=FullAttentionManager) if isinstance(g.spec, SlidingWindowMLASpec) else g
            for g in groups
        ]


FAMILY.declare(
    FaultDeclaration(
        number=30,
        name="sliding-window-mla-managed-as-mla",
        description=(
            "sliding-window MLA is given MLA's manager (full attention's): its blocks never leave "
            "the window and its hits need every block"
        ),
        kvcore=plant_sliding_window_mla_managed_as_mla,
        vllm=VllmPlant(
            number=20,
            description=("vLLM's spec registry giving SlidingWindowMLASpec MLA's manager (FullAttentionManager)"),
            plant=plant_sliding_window_mla_managed_as_mla_in_vllm,
        ),
    )
)
