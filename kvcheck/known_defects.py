"""Defects of vLLM's allocator that kvcheck found and steers its random configurations around.

Each defect is a record: what goes wrong, the conditions that reach it, what kvcheck does about it, the
known releases it is present in, and a reproduction on the installed vLLM (``reproduce()`` returns
whether the defect shows).  ``tests/vllm/test_known_defects.py`` runs every reproduction on every
supported release and holds each known release to its record; on a release kvcheck does not know, a
defect that no longer shows is reported as news, not as a failure.  ``kvcheck doctor`` prints them.

The reproductions call vLLM's ``KVCacheManager`` directly (built by :mod:`kvcheck.targets.vllm_target`):
they need vLLM installed and import it when called.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import attrs

from kvcheck.kinds.chunked_local import CHUNKED_LOCAL
from kvcheck.kinds.full import FULL
from kvcheck.kinds.mamba import ALIGN
from kvcheck.kinds.sliding_window import SLIDING_WINDOW
from kvmodel.group_spec import GroupSpec


@attrs.frozen
class KnownDefect:
    """A defect of vLLM's allocator: ``name``, ``statement`` (what happens, on which steps, and what
    kvcheck does about it), ``present_in`` (the known releases that have it) and ``reproduce`` (whether
    the installed vLLM shows it)."""

    name: str
    statement: str
    present_in: tuple[str, ...]
    reproduce: Callable[[], bool]


def _raises(error: type[BaseException], call: Callable[[], object], where: str | None = None) -> bool:
    """Whether ``call()`` raises ``error`` (raised from the function ``where``, when given)."""
    try:
        call()
    except error as exc:
        return where is None or traceback.extract_tb(exc.__traceback__)[-1].name == where
    return False


def _local_lookup_past_lookahead_hashes(group: GroupSpec) -> bool:
    from kvcheck.targets.vllm_target import make_manager, make_request

    manager = make_manager([group], 12, 2, True, num_hash_lookahead_tokens=2, num_prefill_lookahead=2)
    first = make_request("a", list(range(7)), 2, num_hash_lookahead_tokens=2)
    if manager.allocate_slots(first, 7) is None:
        return False
    first.num_computed_tokens = 7
    manager.free(first)
    second = make_request("b", list(range(5)), 2, num_hash_lookahead_tokens=2)
    return _raises(IndexError, lambda: manager.get_computed_blocks(second))


def _external_tokens_uncounted_beside_mamba() -> bool:
    from kvcheck.targets.vllm_target import make_manager, make_request

    manager = make_manager([FULL.group(), ALIGN.group()], 7, 2, True)
    request = make_request("a", list(range(10)), 2)
    return _raises(ValueError, lambda: manager.allocate_slots(request, 1, num_external_computed_tokens=8))


def _checkpoint_past_the_hashes_async() -> bool:
    from kvcheck.targets.vllm_target import make_manager, make_request

    group = ALIGN.group(prefill_checkpoint_alignment=1)
    manager = make_manager([group], 16, 1, True, num_hash_lookahead_tokens=1, num_prefill_lookahead=1)
    request = make_request("a", list(range(8)), 1, num_hash_lookahead_tokens=1)
    if len(request.block_hashes) != 7 or manager.allocate_slots(request, 7) is None:
        return False
    request.num_computed_tokens = 7
    return _raises(AssertionError, lambda: manager.allocate_slots(request, 2))


def _spec_step_beside_checkpoints() -> bool:
    from kvcheck.targets.vllm_target import make_manager, make_request

    group = ALIGN.group(prefill_checkpoint_alignment=1)
    manager = make_manager([group], 4, 3, True)
    request = make_request("a", [0] * 14, 3)
    for num_new_tokens, sampled in ((12, False), (2, True), (1, True)):
        if manager.allocate_slots(request, num_new_tokens) is None:
            return False
        request.num_computed_tokens += num_new_tokens
        if sampled:
            request.append_output_token_ids(0)
    if (request.num_computed_tokens, request.num_tokens, len(request.block_hashes)) != (15, 16, 5):
        return False
    return _raises(AssertionError, lambda: manager.allocate_slots(request, 1 + 3), "_get_partial_block_hash")


def _short_step_after_rejected_drafts() -> bool:
    from kvcheck.targets.vllm_target import make_manager, make_request

    manager = make_manager([ALIGN.group()], 8, 1, True)
    states = manager.coordinator.single_type_managers[0]
    request = make_request("a", [0], 1)
    if manager.allocate_slots(request, 1) is None:
        return False
    request.num_computed_tokens = 1
    request.append_output_token_ids(0)
    if manager.allocate_slots(request, 1 + 2) is None:
        return False
    request.num_computed_tokens += 1  # both drafts rejected
    request.append_output_token_ids(0)
    if [block.is_null for block in states.req_to_blocks["a"]] != [False, True, True, False]:
        return False
    new_blocks = manager.allocate_slots(request, 1)
    # Where the state after token 3 goes, in 1-token blocks: the null block, no block allocated.
    return bool(
        new_blocks is not None and not any(new_blocks.get_block_ids()[0]) and states.req_to_blocks["a"][2].is_null
    )


def _drafter_in_every_group(attention: GroupSpec, block_sizes: list[int], hash_block_size: int) -> Any:
    """vLLM's manager of ``attention`` beside an align-mode Mamba group (blocks of ``block_sizes``, hashed
    every ``hash_block_size`` tokens), a drafter in both groups prefilling 2 tokens past a chunk."""
    from kvcheck.targets.vllm_target import make_manager

    return make_manager(
        [attention, ALIGN.group()],
        16,
        block_sizes,
        True,
        use_eagle=True,
        num_prefill_lookahead=2,
        hash_block_size=hash_block_size,
        scheduler_block_size=max(block_sizes),
    )


def _keys_of_the_first_state_block(manager: Any, request: Any, chunks: tuple[int, ...], sample: bool) -> list[Any]:
    """The number of tokens the request's first Mamba state block is keyed after, following each chunk
    (a sampled token appended after each when ``sample``); ``None`` after a refused chunk."""
    states = manager.coordinator.single_type_managers[1]
    keyed_after: list[Any] = []
    for num_new_tokens in chunks:
        if manager.allocate_slots(request, num_new_tokens) is None:
            return [*keyed_after, None]
        keyed_after.append(states.req_to_blocks[request.request_id][0].block_hash_num_tokens)
        request.num_computed_tokens += num_new_tokens
        if sample:
            request.append_output_token_ids(0)
    return keyed_after


def _state_keyed_late_with_sub_block_hits() -> bool:
    from kvcheck.targets.vllm_target import make_request

    manager = _drafter_in_every_group(FULL.group(), [2, 4], 2)
    states = manager.coordinator.single_type_managers[1]
    request = make_request("a", list(range(5)), 2)
    # Keyed after 2 tokens in the step computing token 3 into the block, not in the one ending at 2.
    if _keys_of_the_first_state_block(manager, request, (2, 1), sample=False) != [None, 2]:
        return False
    if manager.allocate_slots(request, 1) is None or len(states._pending_cow_copies) != 1:
        return False
    ((source, copy),) = states._pending_cow_copies
    return bool(source is states.req_to_blocks["a"][0] and copy.block_hash_num_tokens == 2)


def _state_keyed_late_without_sub_block_hits() -> bool:
    from kvcheck.targets.vllm_target import make_request

    manager = _drafter_in_every_group(SLIDING_WINDOW.group(window=2), [2, 2], 1)
    if manager.coordinator.enable_partial_hash_hits:
        return False
    states = manager.coordinator.single_type_managers[1]
    request = make_request("a", [0, 0], 1)
    # Keyed after 1 token by the step whose forward ran the block to 2.
    if _keys_of_the_first_state_block(manager, request, (2, 1), sample=True) != [1, 2]:
        return False
    if len(states._pending_cow_copies) != 1:
        return False
    ((source, copy),) = states._pending_cow_copies
    return bool(source is states.req_to_blocks["a"][0] and copy.block_hash_num_tokens == 1)


BOTH = ("0.33.0", "0.34.0")

DEFECTS: tuple[KnownDefect, ...] = (
    KnownDefect(
        "local-lookups-index-past-lookahead-hashes",
        "With block hashes that look 2+ tokens ahead (multi-module MTP), a 5-token request of 2-token blocks "
        "has 1 hash but a 4-token lookup cap: the sliding-window and chunked-local lookups read hash 1 and raise "
        "IndexError (full attention stops at the last hash).  Not reachable while a full-attention group exists "
        "beside them (its hit bounds theirs).  kvcore caps the lookup at the hashed blocks; kvcheck's config "
        "space draws a lookahead above 1 with full attention only.",
        BOTH,
        lambda: all(
            _local_lookup_past_lookahead_hashes(group)
            for group in (SLIDING_WINDOW.group(window=3), CHUNKED_LOCAL.group(window=6))
        ),
    ),
    KnownDefect(
        "external-tokens-uncounted-beside-mamba-align",
        "An align-mode Mamba group counts at most one new block at admission, but a connector's external "
        "tokens get a block of their own before the step's new block: a 10-token request loading 8 external "
        "tokens in 2-token blocks is admitted by a pool of 7 blocks, and get_new_blocks raises ValueError "
        "inside allocate_slots.  An open fix exists upstream (vLLM PR #46892).  kvcheck's drivers trim a load "
        "beside such a group until it ends inside one of its blocks (kvmodel.step_plans.ends_inside_state_blocks).",
        BOTH,
        _external_tokens_uncounted_beside_mamba,
    ),
    KnownDefect(
        "prefill-checkpoint-past-the-hashes",
        "Called as an async step may call it: an 8-token request with hashes that look 1 token ahead (7 "
        "hashes) computes 7 tokens, then schedules 2 (its last known token and one in flight); the chunk's "
        "checkpoint is past the hashes and cache_partial_block asserts.  kvcheck's scheduler reached it by "
        "re-admitting a preempted request while output it scheduled before was in flight; vLLM's own "
        "scheduler does not re-admit such a request outside drop mode (where that output is discarded), and "
        "kvcheck's no longer does, so whether vLLM's scheduler reaches this is not established.  kvcore keeps "
        "such a checkpoint uncached; kvcheck refuses prefill checkpoints with async scheduling and hashes "
        "that look ahead.",
        BOTH,
        _checkpoint_past_the_hashes_async,
    ),
    KnownDefect(
        "speculative-step-beside-prefill-checkpoints",
        "A speculative step's drafts are counted by the prefill-checkpoint logic: a 14-token prompt in 3-token "
        "align-mode blocks with checkpoints, computed to 15 tokens (16 known), schedules its last token and 3 "
        "drafts; the checkpoint falls past the hashes and _get_partial_block_hash asserts.  kvcheck runs no "
        "speculative step beside an align-mode group with prefill checkpoints (TargetConfig.runs_spec_decode).",
        BOTH,
        _spec_step_beside_checkpoints,
    ),
    KnownDefect(
        "short-step-after-rejected-drafts-saves-state-in-the-null-block",
        "A 1-token prompt in 1-token align-mode blocks schedules its last token and 2 drafts, both rejected: "
        "the table reaches 4 positions with 2 tokens computed.  A step without drafts ends after token 3, so "
        "its state goes to position 2, but 3 slots need no new block: position 2 stays the null block, "
        "shared by every table's padding.  kvcheck runs no step ending short of its request's last drafts' "
        "end beside an align-mode group (kvmodel.step_plans.ends_short_of_its_state).",
        BOTH,
        _short_step_after_rejected_drafts,
    ),
    KnownDefect(
        "state-keyed-a-step-late-with-sub-block-hits",
        "4-token Mamba blocks hashed every 2 tokens and a drafter in every group prefilling 2 tokens past a "
        "chunk: a 5-token prompt's state after 2 tokens is keyed by the step computing token 3 into the "
        "block, and the next step copies the state after 3 tokens into the block cached under the 2-token "
        "prefix.  kvcore and kvcheck refuse the combination (num_prefill_lookahead).",
        BOTH,
        _state_keyed_late_with_sub_block_hits,
    ),
    KnownDefect(
        "state-keyed-a-step-late-without-sub-block-hits",
        "The same where a sliding window hashed finer than its blocks turns sub-block hits off: 2-token blocks "
        "hashed every token, the prompt [0, 0] in one chunk; the state block is keyed after 1 token by the "
        "step whose forward ran it to 2.  kvcore and kvcheck refuse it (num_prefill_lookahead).",
        BOTH,
        _state_keyed_late_without_sub_block_hits,
    ),
)
"""Every known defect, as each known release has it."""


def defect_status(defect: KnownDefect, release: str, confirmed: bool) -> str:
    """What the installed release shows of ``defect``: ``present``, ``fixed``, or, on a known release
    that differs from its record, the mismatch; on an unconfirmed release a fix is ``fixed (news)``."""
    shows = defect.reproduce()
    expected = release in defect.present_in
    if not confirmed:
        return "present" if shows else "fixed (news: not recorded for this release)"
    if shows == expected:
        return "present" if shows else "fixed"
    return f"{'present' if shows else 'fixed'}, but recorded as {'present' if expected else 'fixed'} in {release}"
