"""Every catalogued fault bites: a short hand-made sequence breaks a named invariant under the fault
and keeps every invariant on plain kvcore."""

from __future__ import annotations

import attrs
import pytest

from kvcheck.faults import FAULTS, get_fault
from kvcheck.lockstep import Lockstep
from kvcheck.targets import load_target
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.invariants import InvariantViolation
from kvmodel.ops import (
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    Operation,
    Preempt,
    ResetPrefixCache,
    Schedule,
    SpecDecode,
    StartAsyncLoad,
)

FULL = GroupSpec(kind="full")


def one_group(num_blocks: int, block_size: int, group: GroupSpec = FULL, caching: bool = True) -> TargetConfig:
    return TargetConfig(num_blocks=num_blocks, block_size=block_size, groups=(group,), enable_caching=caching)


PRODUCER_STEPS: list[Operation] = [
    AddRequest("r0", (1, 2, 3, 4, 5, 6, 7)),
    Schedule("r0", 7),
    Schedule("r0", 7),
    Schedule("r0", 7),
]
"""A request whose prompt's last hash boundary (6) falls inside a 4-token Mamba block: its chunks stop
at 4 and 6, and its third step writes the block holding the state cached at 6."""

CHECKPOINTS_INSIDE_BLOCKS = TargetConfig(
    num_blocks=32,
    block_size=2,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4, prefill_checkpoint_alignment=1)),
    enable_caching=True,
)

MIXED_DTYPES = TargetConfig(
    num_blocks=16,
    block_size=2,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=4, kv_cache_dtype="fp8")),
    enable_caching=True,
)

# Full attention holding a drafter beside align-mode Mamba states, 4-token blocks hashed every 2 tokens.
DRAFTER_WITH_SUB_BLOCK_HITS = TargetConfig(
    num_blocks=32,
    block_size=4,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
    enable_caching=True,
    use_eagle=True,
    eagle_group_ids=(0,),
    hash_block_size=2,
)

SEQUENCES: dict[str, tuple[TargetConfig, list[Operation], str]] = {
    # Freed with caching off, r0's block 1 must go back to the head, before the
    # never-used block 2; FIFO puts it behind.
    "fifo-reuse-when-caching-off": (
        one_group(3, 1, caching=False),
        [AddRequest("r0", (1,)), Schedule("r0", 1), Finish("r0")],
        "lifo_head_reuse_when_caching_off",
    ),
    # r0's 5 computed tokens hold blocks 1-5 (group 0) and 6-10 (group 1, chunk 4);
    # preempted, they queue as [5, 4, 3, 2, 1, 10, 9, 8, 7, 6].  The retry hits 1-5
    # in group 0 and block 10 (the current chunk's only block) in group 1, and
    # group 0's external block pops 10 before group 1 touches it.
    "interleaved-external-alloc": (
        TargetConfig(
            num_blocks=11, block_size=1, groups=(FULL, GroupSpec(kind="chunked_local", window=4)), enable_caching=True
        ),
        [
            AddRequest("r0", (0,) * 7),
            Schedule("r0", 5),
            Preempt("r0"),
            Schedule("r0", 1, num_external_tokens=1),
        ],
        "no_duplicate_block_ids",
    ),
    # The recomputed request hits its own cached block 1, which sits free.
    "touch-leaves-free-block-queued": (
        one_group(3, 1),
        [AddRequest("r0", (1,)), Schedule("r0", 1), Preempt("r0"), Schedule("r0", 1)],
        "free_queue_well_formed",
    ),
    # Two cached blocks freed: the queue must end [..., 2, 1], tail block first.
    "free-table-head-first": (
        one_group(3, 1),
        [AddRequest("r0", (1, 2)), Schedule("r0", 2), Finish("r0")],
        "lru_eviction_when_caching_on",
    ),
    # One (partial, uncached) block is held when the reset comes.
    "reset-discounts-null-block-twice": (
        one_group(3, 2),
        [AddRequest("r0", (1,)), Schedule("r0", 1), ResetPrefixCache()],
        "reset_refused_only_while_held",
    ),
    # Group 1 (chunk 1) frees its cached block 2 (prefix [1]) once token 0 leaves
    # its chunk; the same step reuses block 2 for group 1's next position, and
    # group 1's entry for [1] stays.
    "reused-block-leaves-map-entry": (
        TargetConfig(
            num_blocks=4, block_size=1, groups=(FULL, GroupSpec(kind="chunked_local", window=1)), enable_caching=True
        ),
        [AddRequest("r0", (1,)), Schedule("r0", 1), Schedule("r0", 1)],
        "cache_map_consistent",
    ),
    # The failed load evicts r0's blocks while r0 still holds them.
    "evict-skips-held-blocks": (
        one_group(2, 1),
        [AddRequest("r0", (1,)), Schedule("r0", 1), FailedLoad("r0")],
        "cache_matches_model",
    ),
    # r1's 2-token prompt may hit at most 1 token, so no block; ceil_div(1, 2) scans one.
    "full-hit-rounds-up": (
        one_group(4, 2),
        [AddRequest("r0", (1, 2)), AddRequest("r1", (1, 2)), Schedule("r0", 2), Schedule("r1", 1)],
        "hit_is_sound_and_maximal",
    ),
    # Window 2: with 2 tokens loaded externally, the next token's window starts at
    # token 1, so position 0 is the null block and only two blocks are allocated.
    "sliding-window-skip-off-by-one": (
        one_group(4, 1, GroupSpec(kind="sliding_window", window=2)),
        [AddRequest("r0", (1, 2, 3)), Schedule("r0", 1, num_external_tokens=2)],
        "lru_eviction_when_caching_on",
    ),
    # Chunk 1, caching off (with caching on, a chunked group takes token 0 as a
    # null-block hit): after 1 external token the next token starts chunk 2, so
    # position 0 is the null block and only one block is allocated.
    "chunked-local-skip-uses-last-token": (
        one_group(4, 1, GroupSpec(kind="chunked_local", window=1), caching=False),
        [AddRequest("r0", (1, 2)), Schedule("r0", 1, num_external_tokens=1)],
        "lifo_head_reuse_when_caching_off",
    ),
    # The chunked group accepts 1 token of null blocks, the full group nothing: the hit is 0.
    "hybrid-hit-takes-max": (
        TargetConfig(
            num_blocks=5, block_size=1, groups=(FULL, GroupSpec(kind="chunked_local", window=1)), enable_caching=True
        ),
        [AddRequest("r0", (1, 2)), Schedule("r0", 1)],
        "hit_is_sound_and_maximal",
    ),
    # r1 hits r0's block 1 but needs a second block, and none is free: refused.
    # A 2-token window needs 1 block before the boundary, and with the drop 2 (the extra one is
    # dropped). r0 cached blocks [2] and [2, 1]; r1 (3 tokens) may hit 1 block: with the extra block
    # [2, 1] matched, the drop leaves block [2]. Matched without it, the run is [2, 1] alone and the
    # drop leaves a hit of 1 block whose window position holds the null block.
    "eagle-window-without-extra-block": (
        TargetConfig(
            num_blocks=3,
            block_size=1,
            groups=(GroupSpec(kind="sliding_window", window=2),),
            enable_caching=True,
            use_eagle=True,
        ),
        [AddRequest("r0", (2, 1)), Schedule("r0", 2), AddRequest("r1", (2, 1, 0)), Schedule("r1", 1)],
        "hit_is_sound_and_maximal",
    ),
    # Two full groups share 2 usable blocks of 2 tokens; a 1-token step with 3 lookahead slots needs
    # 2 blocks per group: refused. Sized without the lookahead it needs 1 per group, is admitted,
    # and the allocation runs out of blocks.
    "admission-ignores-lookahead": (
        TargetConfig(num_blocks=3, block_size=2, groups=(FULL, FULL), enable_caching=True, num_lookahead_tokens=3),
        [AddRequest("r0", (0,)), Schedule("r0", 1)],
        "target_raised",
    ),
    # Blocks of 3 tokens: r0's 2-token prompt is computed, a token is sampled, then 3 drafts are all
    # accepted: 6 tokens computed, two full blocks. The output's cache_blocks(6) caches the second;
    # one token short, it does not.
    "spec-output-caches-one-token-short": (
        one_group(3, 3),
        [AddRequest("r0", (0, 0)), Schedule("r0", 2), SpecDecode("r0", 3, 3)],
        "cache_matches_model",
    ),
    # A 2-module drafter may prefill r0's last token again: of its 4 tokens (2 blocks of 2) only
    # the first block is final, and only it may be cached.
    "reprefillable-tokens-cached": (
        TargetConfig(
            num_blocks=6, block_size=2, groups=(FULL,), enable_caching=True, use_eagle=True, num_prefill_lookahead=2
        ),
        [AddRequest("r0", (0, 1, 2, 3)), Schedule("r0", 4)],
        "cache_matches_model",
    ),
    # Async steps, a window of 2 one-token blocks: r0's 3-token step is in flight when its next token
    # is scheduled. Processed, nothing has left the window; on the scheduled count blocks 1 and 2
    # have, and go back to the pool while the step in flight reads them.
    "window-slides-on-scheduled-tokens": (
        TargetConfig(
            num_blocks=8,
            block_size=1,
            groups=(GroupSpec(kind="sliding_window", window=2),),
            enable_caching=True,
            async_scheduling=True,
        ),
        [AddRequest("r0", (0, 1, 2, 3, 4)), Schedule("r0", 3), Schedule("r0", 1)],
        "in_flight_blocks_held",
    ),
    # Deferred frees: r0 finishes while its step is in flight, so its blocks are popped, in table
    # order [1, 2]; tail first they come out as [2, 1].
    "deferred-free-in-eviction-order": (
        TargetConfig(
            num_blocks=4,
            block_size=1,
            groups=(FULL,),
            enable_caching=True,
            async_scheduling=True,
            defer_block_free=True,
        ),
        [AddRequest("r0", (0, 1)), Schedule("r0", 2), Finish("r0")],
        "tables_match_model",
    ),
    # r0's first token is loaded asynchronously into block 1, which must stay out of the prefix cache
    # until the load lands.
    "delayed-load-cached-at-allocation": (
        one_group(3, 1),
        [AddRequest("r0", (0, 0)), StartAsyncLoad("r0", 1)],
        "cache_matches_model",
    ),
    # The whole 17-token request must fit, 2 tokens in flight at most: 9 full-attention blocks and a
    # window of 8 capped at ceil((8 - 1 + 2) / 2) + 1 = 6 blocks are 15, one more than the 14 free, so
    # it is refused; a cap one block short admits it.
    "window-admission-cap-one-block-short": (
        TargetConfig(
            num_blocks=15,
            block_size=2,
            groups=(FULL, GroupSpec(kind="sliding_window", window=8)),
            enable_caching=True,
            reserve_full_sequence=True,
            max_in_flight_tokens=2,
        ),
        [AddRequest("r0", (0,) * 17), Schedule("r0", 1)],
        "admission_matches_model",
    ),
    "hit-taken-before-admission": (
        one_group(2, 1),
        [AddRequest("r0", (1,)), AddRequest("r1", (1, 2)), Schedule("r0", 1), Schedule("r1", 1)],
        "failed_allocation_changes_nothing",
    ),
    # Group 1 (chunk 1) caches block 2 (prefix [1]) for token 0 and frees it once token 0 leaves its
    # chunk; the same step reuses block 2 for the next position: its entry goes, reported by no
    # BlockRemoved, and the stream still holds it.
    "evicted-block-removal-unreported": (
        TargetConfig(
            num_blocks=4,
            block_size=1,
            groups=(FULL, GroupSpec(kind="chunked_local", window=1)),
            enable_caching=True,
            enable_kv_cache_events=True,
        ),
        [AddRequest("r0", (1,)), Schedule("r0", 1), Schedule("r0", 1)],
        "events_match_cache",
    ),
    # The second step caches r0's block 2 ([1, 2]); its BlockStored lists block 1 ([1]), cached by the
    # first step, as well: the stream holds [1] twice, the cache once.
    "stored-event-repeats-cached-blocks": (
        TargetConfig(num_blocks=3, block_size=1, groups=(FULL,), enable_caching=True, enable_kv_cache_events=True),
        [AddRequest("r0", (1, 2)), Schedule("r0", 1), Schedule("r0", 1)],
        "events_match_cache",
    ),
    # r0's cached block [1] is free when the reset empties the cache; no AllBlocksCleared says so.
    "reset-unreported": (
        TargetConfig(num_blocks=2, block_size=1, groups=(FULL,), enable_caching=True, enable_kv_cache_events=True),
        [AddRequest("r0", (1,)), Schedule("r0", 1), Finish("r0"), ResetPrefixCache()],
        "events_match_cache",
    ),
    # r0's 3-token prompt ends inside block 1 (blocks of 2).  Once 5 tokens are processed the
    # window (1 token) starts at token 4, in block 2: the gap [2, 2) is empty, but rounded down it
    # starts at block 1 and frees the prompt's last block.
    "rswa-gap-starts-inside-the-prompt": (
        one_group(12, 2, GroupSpec(kind="rswa", window=1), caching=False),
        [AddRequest("r0", (0, 0, 0)), Schedule("r0", 3), Schedule("r0", 1), Schedule("r0", 1), Schedule("r0", 1)],
        "rswa_keeps_the_prompt",
    ),
    # Two tokens: the ring takes a block for each, as full attention would.
    "ring-grows-like-full-attention": (
        TargetConfig(num_blocks=8, block_size=1, groups=(FULL, GroupSpec(kind="ring")), enable_caching=False),
        [AddRequest("r0", (0, 0)), Schedule("r0", 2)],
        "ring_holds_one_block",
    ),
    # r0 holds 2 decoder blocks and 1 encoder block, 2 blocks stay free; its decode step needs one,
    # but counting cross-attention for the decoder's 3 tokens asks 2 more.
    "cross-attention-counted-by-decoder-tokens": (
        TargetConfig(
            num_blocks=6,
            block_size=1,
            groups=(FULL, GroupSpec(kind="cross_attention")),
            enable_caching=False,
            num_encoder_tokens=1,
        ),
        [AddRequest("r0", (0, 0)), Schedule("r0", 2), Schedule("r0", 1)],
        "admission_matches_model",
    ),
    # Two tokens computed: the next token reads token 1's state, in block 2 (position 1); counting
    # both tokens as skipped frees that block too, and the new position takes it back from the
    # free queue's head instead of block 1.
    "mamba-frees-the-last-state": (
        one_group(8, 1, GroupSpec(kind="mamba"), caching=False),
        [AddRequest("r0", (0, 0)), Schedule("r0", 2), Schedule("r0", 1)],
        "lifo_head_reuse_when_caching_off",
    ),
    # DeepSeek with a 2-module MTP drafter in group 1: after a 4-token prefill the drafter's group
    # caches 1 block (its last token may be prefilled again), the MLA group both; looked up with the
    # drafter's group, MLA caches 1 block too.
    "mla-looked-up-with-full-attention": (
        TargetConfig(
            num_blocks=9,
            block_size=2,
            groups=(GroupSpec(kind="mla"), FULL),
            enable_caching=True,
            use_eagle=True,
            num_prefill_lookahead=2,
            eagle_group_ids=(1,),
        ),
        [AddRequest("r0", (0, 0, 0, 0)), Schedule("r0", 4)],
        "cache_matches_model",
    ),
    # A 2-token window over 1-token blocks: once 3 tokens are computed, block 1 (token 0) leaves the
    # window and heads the free queue; managed as MLA, it stays in the table.
    "sliding-window-mla-managed-as-mla": (
        one_group(6, 1, GroupSpec(kind="sliding_window_mla", window=2), caching=False),
        [AddRequest("r0", (0, 0, 0)), Schedule("r0", 3), Schedule("r0", 1)],
        "lifo_head_reuse_when_caching_off",
    ),
    # A 3-token prefill needs 3 blocks and 1 speculative block, one more than the 3 free blocks;
    # counted without the speculative block it is admitted, and the allocation runs out of blocks.
    "mamba-speculative-blocks-not-counted": (
        one_group(4, 1, GroupSpec(kind="mamba", speculative_blocks=1), caching=False),
        [AddRequest("r0", (0, 0, 0)), Schedule("r0", 3)],
        "target_raised",
    ),
    # Full attention in 4-token blocks, a 4-token window in 2-token blocks: hits land every 4 tokens.
    # With the window's block of tokens 7..8 evicted, a 9-token request sharing 8 tokens hits 4; aligned
    # to the 2-token hashes, the window takes 6 and full attention the shared block of tokens 5..8,
    # into which the request writes its own tokens 7 and 8.
    "hits-aligned-to-the-hash-size": (
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full", block_size=4), GroupSpec(kind="sliding_window", window=4)),
            enable_caching=True,
        ),
        [
            AddRequest("r0", (1, 2, 3, 4, 5, 6, 7, 8)),
            Schedule("r0", 8),
            Finish("r0"),
            EvictBlocks((6,)),
            AddRequest("r1", (1, 2, 3, 4, 5, 6, 7, 8, 9)),
            Schedule("r1", 9),
        ],
        "hit_is_sound_and_maximal",
    ),
    # Two 2-token full-attention groups hashing every token: the 2-token prompt's boundary after token 1
    # is entered beside block 2's own key; evicting the block leaves that entry behind.
    "partial-key-outlives-eviction": (
        TargetConfig(num_blocks=3, block_size=2, groups=(FULL, FULL), enable_caching=True, hash_block_size=1),
        [AddRequest("r0", (0, 0)), Schedule("r0", 2), EvictBlocks((2,))],
        "cache_map_consistent",
    ),
    # Full attention in 2-token blocks, a 2-token window in 1-token blocks: a hit on a 2-token boundary
    # needs the window's block before it only, so block 0 of the window is not cached.
    "sliding-window-caches-unreachable-blocks": (
        TargetConfig(
            num_blocks=4,
            block_size=1,
            groups=(GroupSpec(kind="full", block_size=2), GroupSpec(kind="sliding_window", window=2)),
            enable_caching=True,
        ),
        [AddRequest("r0", (0, 0)), Schedule("r0", 2)],
        "cache_matches_model",
    ),
    # A 2-token window under a retention interval of 0 keeps only the block before the replay boundary
    # (token 1 of a 2-token prompt): block 0.
    "retention-drops-the-replay-boundary": (
        TargetConfig(
            num_blocks=4,
            block_size=1,
            groups=(GroupSpec(kind="sliding_window", window=2),),
            enable_caching=True,
            prefix_cache_retention_interval=0,
        ),
        [AddRequest("r0", (0, 1)), Schedule("r0", 2)],
        "cache_matches_model",
    ),
    # Full attention beside a 2-token window, interval 0: r0's window keeps its block 1 only, so r1,
    # sharing token 1, misses; the lookup found the 1-token prefix in full attention, and r1's window
    # keeps its block 0 for it.
    "shared-prefix-boundary-dropped": (
        TargetConfig(
            num_blocks=13,
            block_size=1,
            groups=(FULL, GroupSpec(kind="sliding_window", window=2)),
            enable_caching=True,
            prefix_cache_retention_interval=0,
        ),
        [AddRequest("r0", (1, 2, 3)), Schedule("r0", 3), AddRequest("r1", (1, 9, 9)), Schedule("r1", 3)],
        "cache_matches_model",
    ),
    # Over 2 DCP ranks, full attention in blocks of 2 x 2 tokens beside a draft model's replicated
    # 2-token blocks: a 3-token prompt needs 2 replicated blocks, the fault gives 1.
    "replicated-group-sharded": (
        TargetConfig(
            num_blocks=8,
            block_size=2,
            groups=(FULL, GroupSpec(kind="full", dcp_replicated=True)),
            enable_caching=True,
            dcp_world_size=2,
        ),
        [AddRequest("r0", (0, 0, 0)), Schedule("r0", 3)],
        "scheduled_slots_have_blocks",
    ),
    # A 2-token window in blocks of 1 x 2 tokens over 2 DCP ranks: once 4 tokens are processed, 3 are
    # skipped, so block 0 leaves the window; counted in 1-token blocks, block 1 (tokens 2 and 3) too,
    # and the next step's new block reuses it instead of block 0.
    "window-frees-by-rank-blocks": (
        TargetConfig(
            num_blocks=8,
            block_size=1,
            groups=(GroupSpec(kind="sliding_window", window=2),),
            enable_caching=False,
            dcp_world_size=2,
        ),
        [AddRequest("r0", (0, 1, 2, 3)), Schedule("r0", 4), Schedule("r0", 1)],
        "lifo_head_reuse_when_caching_off",
    ),
    # An align-mode Mamba prefill of 8 tokens in 2-token blocks keeps one state, at position 3 (the
    # positions before it are null, never cached): the resend hits 8 tokens there; a left-to-right
    # search ends at position 0 and finds nothing.
    "mamba-state-search-stops-at-first-miss": (
        TargetConfig(num_blocks=12, block_size=2, groups=(GroupSpec(kind="mamba_align"),), enable_caching=True),
        [
            AddRequest("r0", tuple(range(9))),
            Schedule("r0", 8),
            Finish("r0"),
            AddRequest("r1", tuple(range(9))),
            Schedule("r1", 9),
        ],
        "hit_is_sound_and_maximal",
    ),
    # The 8-token chunk takes one block (3 are free); counting the 3 null positions before it asks for 4.
    "mamba-align-counts-the-padding": (
        TargetConfig(num_blocks=4, block_size=2, groups=(GroupSpec(kind="mamba_align"),), enable_caching=True),
        [AddRequest("r0", tuple(range(9))), Schedule("r0", 8)],
        "admission_matches_model",
    ),
    # The 8-token chunk takes its state and 2 speculative blocks, 3 blocks where 2 are free: counted as
    # one block, it is admitted and the allocation runs dry.
    "mamba-align-speculative-blocks-not-counted": (
        TargetConfig(
            num_blocks=3,
            block_size=2,
            groups=(GroupSpec(kind="mamba_align", speculative_blocks=2),),
            enable_caching=True,
        ),
        [AddRequest("r0", tuple(range(9))), Schedule("r0", 8)],
        "target_raised",
    ),
    # A drafter's 2 lookahead slots beside 2-token Mamba blocks: r0's 3-token step saves its state in the
    # block of token 3 (position 1), but a table grown to 5 slots padded that position with the null block.
    "mamba-align-allocates-lookahead-slots": (
        TargetConfig(
            num_blocks=6,
            block_size=2,
            groups=(GroupSpec(kind="mamba_align"),),
            enable_caching=True,
            num_lookahead_tokens=2,
        ),
        [AddRequest("r0", (0, 0, 0, 0)), Schedule("r0", 3)],
        "mamba_align_keeps_few_states",
    ),
    # Full attention and Mamba states in 4-token blocks, hashed every 2 tokens: r0's chunks stop at its
    # prompt's last hash boundary, 6, where its state is cached inside block 1, and r1 hits it there.
    "partial-hit-not-copied": (
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
            enable_caching=True,
        ),
        [*PRODUCER_STEPS, Finish("r0"), AddRequest("r1", (1, 2, 3, 4, 5, 6, 9, 9, 9)), Schedule("r1", 9)],
        "hit_block_never_written",
    ),
    # r0's third step computes token 7 into the block holding its state at 6: the copy the cache keeps
    # takes a block, and one is free beside full attention's.
    "copy-block-not-counted": (
        TargetConfig(
            num_blocks=6,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
            enable_caching=True,
        ),
        PRODUCER_STEPS,
        "target_raised",
    ),
    "state-entry-left-on-written-block": (
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
            enable_caching=True,
        ),
        PRODUCER_STEPS,
        "lru_eviction_when_caching_on",
    ),
    # Full attention beside a sliding window in fp8: two KV cache dtypes, so new blocks are zeroed.
    "zeroing-record-not-drained": (
        MIXED_DTYPES,
        [AddRequest("a", (1, 2, 3)), Schedule("a", 3, 0, 7), Schedule("a", 1, 0, 7)],
        "zeroed_blocks_are_fresh",
    ),
    "hit-blocks-zeroed": (
        MIXED_DTYPES,
        [
            AddRequest("a", (1, 2, 3, 4)),
            Schedule("a", 4, 0, 7),
            AddRequest("b", (1, 2, 3, 4, 5)),
            Schedule("b", 5, 0, 7),
        ],
        "zeroed_blocks_are_fresh",
    ),
    "async-load-blocks-zeroed": (
        MIXED_DTYPES,
        [AddRequest("a", (1, 2, 3, 4, 5, 6, 7)), StartAsyncLoad("a", 4)],
        "zeroed_blocks_are_fresh",
    ),
    # A 10-token prompt in one chunk keeps the state after 8 tokens in position 1: the block it takes
    # there (1) is handed out before the last state's (2); left null, the state takes block 1.
    "checkpoint-block-left-null": (
        TargetConfig(
            num_blocks=16,
            block_size=4,
            groups=(GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1),),
            enable_caching=True,
        ),
        [AddRequest("a", tuple(range(10))), Schedule("a", 10)],
        "lru_eviction_when_caching_on",
    ),
    # A first chunk of 8 keeps the state after 6 tokens in position 0 of 4-token Mamba blocks hashed
    # every 2: transient, so position 0's 4-token key goes; kept, the cache holds an entry too many.
    "transient-checkpoint-keeps-its-key": (
        CHECKPOINTS_INSIDE_BLOCKS,
        [AddRequest("a", tuple(range(1, 21))), Schedule("a", 8)],
        "cache_matches_model",
    ),
    # Under an interval of 0 a 12-token prompt keeps only its replay boundary's state (after 10 tokens): a
    # first chunk of 4 caches no state; caching every state, the state after 4 is one entry too many.
    "retention-caches-every-state": (
        TargetConfig(
            num_blocks=32,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
            enable_caching=True,
            prefix_cache_retention_interval=0,
        ),
        [AddRequest("a", tuple(range(12))), Schedule("a", 4)],
        "cache_matches_model",
    ),
    # Under an interval of 0 a first chunk of 8 of a 14-token prompt keeps no checkpoint (its position 0
    # stays null); reserving one, the chunk takes a block more (1, 2 where 0, 1 is due).
    "checkpoint-before-the-prefill-end": (
        TargetConfig(
            num_blocks=16,
            block_size=4,
            groups=(GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1),),
            enable_caching=True,
            prefix_cache_retention_interval=0,
        ),
        [AddRequest("a", tuple(range(14))), Schedule("a", 8)],
        "lru_eviction_when_caching_on",
    ),
    # Beside an EAGLE drafter an 11-token prompt in one chunk keeps its checkpoint after 8 tokens (a hit
    # boundary below the last one, 10); kept short of the last token instead, it is cached after 10.
    "checkpoint-ignores-the-eagle-drop": (
        TargetConfig(
            num_blocks=32,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1)),
            enable_caching=True,
            use_eagle=True,
            eagle_group_ids=(0,),
        ),
        [AddRequest("a", tuple(range(11))), Schedule("a", 11)],
        "cache_matches_model",
    ),
    # 4-token blocks hashed every 2 tokens: a request sharing a 12-token prompt hits 10 beside a drafter
    # (full attention drops one hash block, onto the state after 10); dropping a block, it hits 8.
    "eagle-drops-a-block-inside-sub-block-hits": (
        DRAFTER_WITH_SUB_BLOCK_HITS,
        [
            AddRequest("a", tuple(range(12))),
            Schedule("a", 12),
            Schedule("a", 12),
            Schedule("a", 12),
            Finish("a"),
            AddRequest("b", (*range(12), 50, 51)),
            Schedule("b", 14),
        ],
        "hit_is_sound_and_maximal",
    ),
    # Shared-prefix checkpoints beside a drafter with sub-block hits: b shares 10 of a's 16 tokens; full
    # attention finds 8, less the drafter's hash block, so the junction is at 6 (Mamba hits nothing) and
    # b's first chunk stops there and caches its state after 6; left uncached, an entry is missing.
    "shared-prefix-state-left-uncached": (
        attrs.evolve(DRAFTER_WITH_SUB_BLOCK_HITS, enable_mamba_shared_prefix_checkpoint=True),
        [
            AddRequest("a", tuple(range(16))),
            *[Schedule("a", 16)] * 4,
            Finish("a"),
            AddRequest("b", (*range(10), *[90] * 6)),
            Schedule("b", 16),
        ],
        "cache_matches_model",
    ),
    # R-SWA and Mamba states in 4-token blocks hashed every 2 tokens: a's state after 6 is cached inside
    # a block, and b, sharing 6 tokens, hits there inside R-SWA's block 1; probing whole blocks only, 4.
    "rswa-hits-stop-at-whole-blocks": (
        TargetConfig(
            num_blocks=32,
            block_size=2,
            groups=(GroupSpec(kind="rswa", window=3, block_size=4), GroupSpec(kind="mamba_align", block_size=4)),
            enable_caching=True,
            hash_block_size=2,
        ),
        [*PRODUCER_STEPS, Finish("r0"), AddRequest("b", (1, 2, 3, 4, 5, 6, 9, 9, 9)), Schedule("b", 9)],
        "hit_is_sound_and_maximal",
    ),
    # A sliding window in 4-token blocks hashed every 2 tokens keeps hits on the scheduler block size, 4:
    # under a retention interval of 0 the window caches only the blocks a hit at a's replay boundary on
    # that size needs, none of a's first 7 tokens; asked for hits on the hash size, it caches block 0.
    "sub-block-hits-beside-a-window-hashed-finer": (
        TargetConfig(
            num_blocks=32,
            block_size=2,
            groups=(
                GroupSpec(kind="sliding_window", window=3, block_size=4),
                GroupSpec(kind="mamba_align", block_size=4),
            ),
            enable_caching=True,
            hash_block_size=2,
            prefix_cache_retention_interval=0,
        ),
        [AddRequest("a", tuple(range(11))), Schedule("a", 7)],
        "cache_matches_model",
    ),
    # Full attention sharded over 2 ranks (blocks of 2 x 2 tokens) beside Mamba states in 2-token blocks,
    # hashed every 2: sub-block hits are on.  a's 7-token prompt is computed in chunks ending on the
    # scheduler block, 4, and on its last hash boundary, 6, inside full attention's block 1, where its
    # state and that block are cached.  Asked for by the one-rank rule, sub-block hits are off: the
    # second chunk runs to the prompt's end and nothing past 4 is cached.
    "sub-block-hits-off-under-dcp-at-equal-sizes": (
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
            enable_caching=True,
            dcp_world_size=2,
        ),
        [AddRequest("a", tuple(range(7))), Schedule("a", 4), Schedule("a", 3)],
        "cache_matches_model",
    ),
    # r0 caches its state after 6 tokens inside Mamba block 1 (4-token blocks hashed every 2); r1 hits those
    # 6 tokens, and a connector loads 3 past the scheduler block boundary at 4: the hit is cut back to 4
    # (the load covers its tail) and Mamba keeps nothing of it.  Keeping its hit whole, the Mamba group
    # takes the cached block of the state after 6 tokens for the state the load ends on.
    "truncated-hit-keeps-its-state": (
        CHECKPOINTS_INSIDE_BLOCKS,
        [*PRODUCER_STEPS, AddRequest("r1", (1, 2, 3, 4, 5, 6, 9, 9, 9, 9)), Schedule("r1", 4, 3)],
        "hit_is_sound_and_maximal",
    ),
    # r0 caches its state after 6 tokens inside its second 4-token Mamba block; its third step copies that
    # block for the cache and offers a connector the copy.  Offering the block r0 goes on writing instead,
    # the connector would offload that step's state under the key of 6 tokens.
    "state-offered-from-its-written-block": (
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
            enable_caching=True,
        ),
        PRODUCER_STEPS,
        "state_offloads_well_formed",
    ),
    # Under async scheduling r0 caches its state after 3 tokens inside its 6-token Mamba block with the
    # step still in flight, and finishes: the step in flight may write past the state, so nothing is
    # offered.  Offering the block anyway, the connector would offload a later token's state.
    "finished-tail-offered-after-later-tokens": (
        TargetConfig(
            num_blocks=3,
            block_size=3,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=6)),
            enable_caching=True,
            async_scheduling=True,
        ),
        [AddRequest("r0", (0, 0, 0, 0)), Schedule("r0", 3), Finish("r0")],
        "state_offloads_well_formed",
    ),
    # a caches its state after 4 tokens; b, sharing those 4 and scheduled in the same step, must wait for
    # the next step (refused); hitting it at once, b is admitted.
    "state-hit-in-the-step-that-caches-it": (
        TargetConfig(
            num_blocks=32,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
            enable_caching=True,
        ),
        [
            AddRequest("a", tuple(range(8))),
            Schedule("a", 4),
            AddRequest("b", (*range(4), 9, 9)),
            Schedule("b", 2, same_step=True),
        ],
        "admission_matches_model",
    ),
}


@pytest.mark.parametrize("fault_name", sorted(FAULTS))
def test_each_fault_breaks_its_invariant_at_the_last_step_of_a_sequence_kvcore_passes(fault_name: str) -> None:
    """The fault's sequence keeps every invariant on plain kvcore and, with the fault planted,
    violates the expected invariant at its last operation."""
    assert fault_name in SEQUENCES, f"fault {fault_name!r} has no sequence proving that the suite catches it"
    config, ops, expected_invariant = SEQUENCES[fault_name]
    plain = Lockstep(load_target("kvcore"), config)
    for op in ops:
        plain.step(op)
    faulty = Lockstep(get_fault(fault_name).kvcore_target, config)
    with pytest.raises(InvariantViolation) as caught:
        for op in ops:
            faulty.step(op)
    assert caught.value.invariant == expected_invariant, str(caught.value)
    assert caught.value.step == len(ops), f"violated before the last step: {caught.value}"
