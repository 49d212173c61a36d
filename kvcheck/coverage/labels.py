"""The coverage labels: the states where allocator bugs live, each named by the text ``event()`` reports,
and which of them a run of each layout of groups must reach."""

from __future__ import annotations

POOL_EXHAUSTED = "pool exhausted"
ALLOCATION_REFUSED = "allocation returned None"
CACHED_BLOCK_EVICTED = "cached block evicted"
HIT_ACROSS_ALL_GROUPS = "prefix hit across all groups"
HIT_ON_FREE_BLOCK = "hit on a ref-count-0 block"
EXTERNAL_WITH_LOCAL_HIT = "external tokens with a local hit"
SLIDING_WINDOW_FREED = "sliding window freed a block"
REHIT_AFTER_PREEMPTION = "preemption then re-hit of own blocks"
EAGLE_DROP_SHORTENED_HIT = "EAGLE drop shortened a hit"
LOOKAHEAD_REFUSED = "lookahead slots made a step not fit"
ROLLBACK_AFTER_REJECTION = "rollback after rejected drafts"
WINDOW_HELD_FOR_IN_FLIGHT = "window block held for a step in flight"
DEFERRED_FREE_RELEASED = "deferred free released after its step"
ASYNC_LOAD_CACHED = "async load cached when it landed"
EVENT_STORE_AFTER_PARENT = "KV cache event: store after a parent"
EVENT_REMOVAL = "KV cache event: entry removed"
EVENT_CLEAR = "KV cache event: cache cleared"
RSWA_GAP_FREED = "R-SWA freed a gap block after the prompt"
RING_BLOCK_KEPT = "ring buffer kept its one block through a step"
CROSS_ATTENTION_ALLOCATED = "cross-attention blocks allocated on admission"
MAMBA_STATE_FREED = "Mamba freed the state block behind its last token"
MAMBA_SPECULATIVE_REFUSED = "Mamba speculative blocks made a step not fit"
HIT_ACROSS_MLA_AND_FULL = "prefix hit across MLA and full-attention groups"
HIT_ACROSS_BLOCK_SIZES = "prefix hit across groups of different block sizes"
PARTIAL_ENTRY_CACHED = "prompt's last hash boundary cached inside a block"
RETENTION_HIT = "prefix hit on a sliding window under a retention interval"
SHARED_PREFIX_RECORDED = "lookup found a shared prefix past the hit under a retention interval"
CONTEXT_PARALLEL_HIT = "prefix hit on blocks sharded over decode context parallel ranks"
MAMBA_ALIGN_HIT = "prefix hit on an align-mode Mamba state"
MAMBA_ALIGN_PADDED = "align-mode Mamba step padded null blocks before its new state"
SUB_BLOCK_HIT_COPIED = "hit ending inside a block copied on write"
STATE_COPIED_FOR_CACHE = "Mamba state cached inside a block copied for the cache"
MIXED_PRECISION_ZEROED = "new blocks zeroed in a cache of two KV cache dtypes"
ASYNC_LOAD_LEFT_UNZEROED = "async load's blocks left out of zeroing"
PREFILL_CHECKPOINT_CACHED = "prefill checkpoint cached under a boundary past its block's end"
PREFILL_CHECKPOINT_TRANSIENT = "transient prefill checkpoint left uncached"
PREFILL_CHECKPOINT_IN_SPECULATIVE_BLOCK = "prefill checkpoint kept in a speculative block"
STATE_HIT_UNDER_RETENTION = "prefix hit on a Mamba state under a retention interval"
STATE_THINNED_BY_RETENTION = "Mamba state left uncached by a retention interval"
CHECKPOINT_HELD_FOR_PREFILL_END = "prefill checkpoint held back for the chunk ending the prefill"
STATE_HIT_BESIDE_DRAFTER = "prefix hit on a Mamba state beside an EAGLE drafter's drop"
CHECKPOINT_BESIDE_DRAFTER = "prefill checkpoint kept a hit boundary lower for an EAGLE drafter"
STATE_HIT_DEFERRED = "hit on a Mamba state cached in the same step deferred to the next"
HIT_INSIDE_BLOCK_BESIDE_DRAFTER = "hit ending inside a drafter group's block after a one-hash-block drop"
SHARED_PREFIX_STATE_CACHED = "Mamba state cached at a shared prefix's end (shared-prefix checkpoint)"
STATE_HIT_BESIDE_WINDOW = "prefix hit on a Mamba state beside local attention"
STATE_HIT_WITH_SUB_BLOCK_HITS_OFF = "prefix hit on a Mamba state with sub-block hits off beside a window hashed finer"
RSWA_HIT_INSIDE_BLOCK = "hit ending inside an R-SWA block copied on write"
STATE_HIT_INSIDE_SHARDED_BLOCK = "prefix hit on a Mamba state ending inside a block sharded over DCP ranks"
EXTERNAL_BESIDE_STATES = "external tokens loaded beside an align-mode Mamba group"
SUB_BLOCK_HIT_CUT_BACK = "sub-block hit cut back to a block boundary for external tokens"
STATE_OFFERED = "Mamba state offered a connector with its block"
STATE_OFFERED_FROM_ITS_COPY = "Mamba state cached inside a block offered a connector from its copy"
FINISHED_STATE_OFFERED = "finishing request's Mamba state inside its block offered a connector"
TABLE_PAST_STATE_AFTER_DRAFTS = "align-mode Mamba table left past its state by rejected drafts"

ALIGN_FEATURE_LABELS = (
    PREFILL_CHECKPOINT_CACHED,
    PREFILL_CHECKPOINT_TRANSIENT,
    PREFILL_CHECKPOINT_IN_SPECULATIVE_BLOCK,
    STATE_HIT_UNDER_RETENTION,
    STATE_THINNED_BY_RETENTION,
    CHECKPOINT_HELD_FOR_PREFILL_END,
    STATE_HIT_BESIDE_DRAFTER,
    CHECKPOINT_BESIDE_DRAFTER,
    STATE_HIT_DEFERRED,
    HIT_INSIDE_BLOCK_BESIDE_DRAFTER,
    SHARED_PREFIX_STATE_CACHED,
    STATE_HIT_INSIDE_SHARDED_BLOCK,
    EXTERNAL_BESIDE_STATES,
    SUB_BLOCK_HIT_CUT_BACK,
    STATE_OFFERED,
    STATE_OFFERED_FROM_ITS_COPY,
    FINISHED_STATE_OFFERED,
    TABLE_PAST_STATE_AFTER_DRAFTS,
)
"""The labels of align-mode Mamba features: prefill checkpoints, sparse state retention, an EAGLE drafter
beside the group (and its one-hash-block drop with sub-block hits), shared-prefix checkpoints, steps of several
requests, sub-block hits inside blocks sharded over decode context parallel ranks, a connector's external
tokens (and the sub-block hits they supersede), boundary states offered a connector (from a copy, and as a
request finishes), speculative decode steps whose rejected drafts leave the table past the state."""

SAMBA_LABELS = (STATE_HIT_BESIDE_WINDOW, STATE_HIT_WITH_SUB_BLOCK_HITS_OFF, RSWA_HIT_INSIDE_BLOCK)
"""The labels of Mamba states beside local attention (the ``samba`` layout): sub-block hits off beside a
sliding window or chunked-local group hashed finer than its blocks, and R-SWA's hits inside its blocks."""

ALL_LABELS = (
    POOL_EXHAUSTED,
    ALLOCATION_REFUSED,
    CACHED_BLOCK_EVICTED,
    HIT_ACROSS_ALL_GROUPS,
    HIT_ON_FREE_BLOCK,
    EXTERNAL_WITH_LOCAL_HIT,
    SLIDING_WINDOW_FREED,
    REHIT_AFTER_PREEMPTION,
    EAGLE_DROP_SHORTENED_HIT,
    LOOKAHEAD_REFUSED,
    ROLLBACK_AFTER_REJECTION,
    WINDOW_HELD_FOR_IN_FLIGHT,
    DEFERRED_FREE_RELEASED,
    ASYNC_LOAD_CACHED,
    EVENT_STORE_AFTER_PARENT,
    EVENT_REMOVAL,
    EVENT_CLEAR,
    RSWA_GAP_FREED,
    RING_BLOCK_KEPT,
    CROSS_ATTENTION_ALLOCATED,
    MAMBA_STATE_FREED,
    MAMBA_SPECULATIVE_REFUSED,
    HIT_ACROSS_MLA_AND_FULL,
    HIT_ACROSS_BLOCK_SIZES,
    PARTIAL_ENTRY_CACHED,
    RETENTION_HIT,
    SHARED_PREFIX_RECORDED,
    CONTEXT_PARALLEL_HIT,
    MAMBA_ALIGN_HIT,
    MAMBA_ALIGN_PADDED,
    SUB_BLOCK_HIT_COPIED,
    STATE_COPIED_FOR_CACHE,
    MIXED_PRECISION_ZEROED,
    ASYNC_LOAD_LEFT_UNZEROED,
    *ALIGN_FEATURE_LABELS,
    *SAMBA_LABELS,
)


GROUP_LAYOUTS: tuple[int | str | None, ...] = (None, 2, 3, 4, "mamba", "samba")
"""Group counts the manager machine runs with when --groups is not given: drawn from 1 to 4
per run, then 2, 3 and 4 fixed, so every hybrid width gets its own full example budget; then
Mamba layouts alone (full attention beside Mamba groups, or Mamba alone), whose states, in both
cache modes and in blocks larger than the hashes, get a budget of their own; then Mamba beside local
attention (``samba``), a few of the others' draws."""

EXAMPLES_FACTOR: dict[int | str | None, int] = {"mamba": 2, "samba": 2}
"""Layouts whose run, where every label must be reached, searches with this many times the profile's
examples: they must reach labels that only about one example in a hundred makes (the Mamba layouts the
most labels; Mamba beside local attention a hit ending inside an R-SWA block, which needs a resumed or
repeated prompt to end inside one)."""

MAMBA_LABELS = (
    MAMBA_STATE_FREED,
    MAMBA_SPECULATIVE_REFUSED,
    MAMBA_ALIGN_HIT,
    MAMBA_ALIGN_PADDED,
    SUB_BLOCK_HIT_COPIED,
    STATE_COPIED_FOR_CACHE,
    *ALIGN_FEATURE_LABELS,
)
"""The labels of Mamba groups' states, which the run of Mamba layouts must reach."""


def reachable_labels(num_groups: int | str | None) -> tuple[str, ...]:
    """The labels a run must reach when its layouts have ``num_groups`` groups (``None``: drawn from
    1 to 4), or are all of the layout ``num_groups`` names.  A run of Mamba layouts (``"mamba"``)
    must reach the Mamba labels, and one of Mamba beside local attention (``"samba"``) its own,
    which the others are spared (those layouts are a few of their draws).  A hit across all groups
    (or across MLA and full attention) needs two groups at least, as does a shared prefix one group
    cached past the hit, and cross-attention sits beside the decoder's self-attention."""
    if num_groups == "mamba":
        return MAMBA_LABELS
    if num_groups == "samba":
        return SAMBA_LABELS
    general = tuple(label for label in ALL_LABELS if label not in (*MAMBA_LABELS, *SAMBA_LABELS))
    if num_groups == 1:
        multi_group = (
            HIT_ACROSS_ALL_GROUPS,
            CROSS_ATTENTION_ALLOCATED,
            HIT_ACROSS_MLA_AND_FULL,
            HIT_ACROSS_BLOCK_SIZES,
            PARTIAL_ENTRY_CACHED,
            SHARED_PREFIX_RECORDED,
            MIXED_PRECISION_ZEROED,
            ASYNC_LOAD_LEFT_UNZEROED,
        )
        return tuple(label for label in general if label not in multi_group)
    return general


def labels_required(layouts: tuple[int | str | None, ...]) -> tuple[str, ...]:
    """The labels runs of the given layouts (see :func:`reachable_labels`) must reach between them."""
    required = {label for layout in layouts for label in reachable_labels(layout)}
    return tuple(label for label in ALL_LABELS if label in required)
