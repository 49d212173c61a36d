"""Defects of vLLM 0.33.0's allocator that kvcheck found and steers its random configurations around.

Each test pins the defect on the installed release: when a release fixes
it, the test fails, and the restriction it names in the config space can go.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.config import GroupSpec
from kvcheck.targets.vllm_target import make_manager, make_request


@pytest.mark.parametrize("group", [GroupSpec("sliding_window", 3), GroupSpec("chunked_local", 6)])
def test_local_attention_lookups_index_past_hashes_that_look_two_tokens_ahead(group: GroupSpec) -> None:
    """With block hashes that look 2+ tokens ahead (multi-module MTP), a 5-token request of 2-token
    blocks has 1 hash but a 4-token lookup cap: the sliding-window and chunked-local lookups read
    hash 1 and raise IndexError (full attention stops at the last hash).  kvcore caps the lookup at
    the hashed blocks; kvcheck's config space draws a lookahead above 1 with full attention only."""
    manager = make_manager([group], 12, 2, True, num_hash_lookahead_tokens=2, num_prefill_lookahead=2)
    first = make_request("a", list(range(7)), 2, num_hash_lookahead_tokens=2)
    assert manager.allocate_slots(first, 7) is not None
    first.num_computed_tokens = 7
    manager.free(first)
    with pytest.raises(IndexError):
        manager.get_computed_blocks(make_request("b", list(range(5)), 2, num_hash_lookahead_tokens=2))


def test_external_tokens_beside_an_align_mode_mamba_group_are_not_counted_at_admission() -> None:
    """An align-mode Mamba group counts at most one new block at admission, but a connector's external
    tokens get a block of their own (their last state, after null padding) before the step's new
    block: a 10-token request loading 8 external tokens in 2-token blocks is admitted by a pool of 7
    blocks (6 free: 5 counted for full attention, 1 for Mamba); full attention takes its 5, Mamba
    the external tokens' block, and the pool is dry for Mamba's new block: ``get_new_blocks`` raises
    ``ValueError`` inside ``allocate_slots``.  Beside an align-mode Mamba group kvcheck's drivers trim a
    load until it ends inside a block of the group and end the step's chunk in that block, so that the
    load's state and the step's share the one block counted (``kvcheck.ops.ends_inside_state_blocks``)."""
    manager = make_manager([GroupSpec("full"), GroupSpec("mamba_align")], 7, 2, True)
    request = make_request("a", list(range(10)), 2)
    with pytest.raises(ValueError, match="Cannot get"):
        manager.allocate_slots(request, 1, num_external_computed_tokens=8)


def test_a_prefill_checkpoint_past_the_hashes_asserts() -> None:
    """Under async scheduling a running request's step may reach a token still being sampled: an 8-token
    request with hashes that look 1 token ahead (7 hashes) computes 7 tokens, then schedules 2 (its last
    known token and the one in flight).  The chunk's checkpoint is the state after 8 tokens, past the
    hashes, and ``cache_partial_block`` asserts.  kvcore keeps such a checkpoint uncached, as a
    transient one; kvcheck refuses prefill checkpoints with async scheduling and hashes that look ahead
    (``groups[i].prefill_checkpoint_alignment``) and its config space draws none there."""
    group = GroupSpec("mamba_align", prefill_checkpoint_alignment=1)
    manager = make_manager([group], 16, 1, True, num_hash_lookahead_tokens=1, num_prefill_lookahead=1)
    request = make_request("a", list(range(8)), 1, num_hash_lookahead_tokens=1)
    assert len(request.block_hashes) == 7
    assert manager.allocate_slots(request, 7) is not None
    request.num_computed_tokens = 7
    with pytest.raises(AssertionError):
        manager.allocate_slots(request, 2)


def test_a_speculative_step_beside_prefill_checkpoints_asserts() -> None:
    """A speculative decode step's drafts are not in the request's tokens, but the prefill checkpoint
    logic counts them: a 14-token prompt in 3-token align-mode Mamba blocks with prefill checkpoints,
    computed to 15 tokens (16 known), schedules its last token and 3 drafts; the step's checkpoint falls
    past the request's hashes and ``cache_partial_block`` asserts.  kvcore keeps such a checkpoint
    uncached, as a transient one; kvcheck runs no speculative decode step beside an align-mode group with
    prefill checkpoints (``TargetConfig.runs_spec_decode``)."""
    group = GroupSpec("mamba_align", prefill_checkpoint_alignment=1)
    manager = make_manager([group], 4, 3, True)
    request = make_request("a", [0] * 14, 3)
    for num_new_tokens, sampled in ((12, False), (2, True), (1, True)):
        assert manager.allocate_slots(request, num_new_tokens) is not None
        request.num_computed_tokens += num_new_tokens
        if sampled:
            request.append_output_token_ids(0)
    assert (request.num_computed_tokens, request.num_tokens, len(request.block_hashes)) == (15, 16, 5)
    with pytest.raises(AssertionError) as raised:
        manager.allocate_slots(request, 1 + 3)
    assert raised.traceback[-1].name == "_get_partial_block_hash"


def test_a_step_ending_short_of_rejected_drafts_leaves_its_state_position_null() -> None:
    """vLLM's model runner saves a step's Mamba state in the block of the step's last token (drafts
    included) and copies it from there at the next step.  A 1-token prompt in 1-token align-mode blocks
    schedules its last token and 2 drafts, both rejected: the table reaches 4 positions (its state block
    at position 3) with 2 tokens computed.  A step without drafts ends after token 3, so its state goes
    to position 2, but 3 slots need no new block: nothing is allocated, and position 2 holds the null
    block, shared by every table's padding.  kvcore allocates as vLLM does; kvcheck runs no step ending
    short of its request's last drafts' end beside an align-mode group (a drafter proposing as many
    tokens every step schedules none: ``kvcheck.ops.ends_short_of_its_state``)."""
    manager = make_manager([GroupSpec("mamba_align")], 8, 1, True)
    states = manager.coordinator.single_type_managers[0]
    request = make_request("a", [0], 1)
    assert manager.allocate_slots(request, 1) is not None
    request.num_computed_tokens = 1
    request.append_output_token_ids(0)
    assert manager.allocate_slots(request, 1 + 2) is not None
    request.num_computed_tokens += 1  # both drafts rejected
    request.append_output_token_ids(0)
    assert [block.is_null for block in states.req_to_blocks["a"]] == [False, True, True, False]
    new_blocks = manager.allocate_slots(request, 1)
    assert new_blocks is not None and not any(new_blocks.get_block_ids()[0])
    assert states.req_to_blocks["a"][2].is_null  # where the state after token 3 goes, in 1-token blocks


def _drafter_in_every_group(attention: GroupSpec, block_sizes: list[int], hash_block_size: int) -> Any:
    """vLLM's manager of ``attention`` beside an align-mode Mamba group (blocks of ``block_sizes``, hashed
    every ``hash_block_size`` tokens), a drafter in both groups prefilling 2 tokens past a chunk."""
    return make_manager(
        [attention, GroupSpec("mamba_align")],
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
    (a sampled token appended after each when ``sample``)."""
    states = manager.coordinator.single_type_managers[1]
    keyed_after = []
    for num_new_tokens in chunks:
        assert manager.allocate_slots(request, num_new_tokens) is not None
        keyed_after.append(states.req_to_blocks[request.request_id][0].block_hash_num_tokens)
        request.num_computed_tokens += num_new_tokens
        if sample:
            request.append_output_token_ids(0)
    return keyed_after


def test_a_mamba_state_inside_a_block_is_keyed_a_step_late_when_a_drafter_prefills_again() -> None:
    """Sub-block hits (4-token Mamba blocks hashed every 2 tokens) and a drafter in every group, the
    Mamba group's too, prefilling 2 tokens past a chunk (1 token it may prefill again, which a dropping
    group does not cache yet).  A 5-token prompt's reusable state is the one after 2 tokens, inside the
    first state block.  Its chunk [0, 2) caches nothing (1 token is final); the next chunk [2, 3) keys
    the block after 2 tokens, though that step's forward runs the same block on to 3: the next step
    copies the state after 3 tokens into the block the cache keeps under the 2-token prefix.  kvcore
    and kvcheck refuse the combination (``num_prefill_lookahead``); kvcheck's config space draws a
    lookahead of at most 1 there."""
    manager = _drafter_in_every_group(GroupSpec("full"), [2, 4], 2)
    states = manager.coordinator.single_type_managers[1]
    request = make_request("a", list(range(5)), 2)
    # Keyed after 2 tokens in the step computing token 3 into the block, not in the one ending at 2.
    assert _keys_of_the_first_state_block(manager, request, (2, 1), sample=False) == [None, 2]
    assert manager.allocate_slots(request, 1) is not None
    ((source, copy),) = states._pending_cow_copies
    assert source is states.req_to_blocks["a"][0] and copy.block_hash_num_tokens == 2


def test_the_state_is_keyed_a_step_late_with_sub_block_hits_off_too() -> None:
    """The same defect where a sliding window hashed finer than its blocks turns sub-block hits off:
    2-token blocks hashed every token, a drafter in both groups prefilling 2 tokens past a chunk.  The
    prompt [0, 0] is computed in one chunk whose forward runs its state block to 2 tokens, yet the block
    is keyed after 1 (the last token is one a drafter may prefill again, and the Mamba group caches up
    to the prompt's last hash boundary all the same); the next step copies that block, by then keyed
    after 2 tokens, into one the cache keeps under the 1-token prefix.  kvcore and kvcheck refuse it
    (``num_prefill_lookahead``), as with sub-block hits on."""
    manager = _drafter_in_every_group(GroupSpec("sliding_window", 2), [2, 2], 1)
    assert not manager.coordinator.enable_partial_hash_hits
    states = manager.coordinator.single_type_managers[1]
    request = make_request("a", [0, 0], 1)
    # Keyed after 1 token by the step whose forward ran the block to 2.
    assert _keys_of_the_first_state_block(manager, request, (2, 1), sample=True) == [1, 2]
    ((source, copy),) = states._pending_cow_copies
    assert source is states.req_to_blocks["a"][0] and copy.block_hash_num_tokens == 1
