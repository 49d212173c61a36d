"""The invariants of a request's tables: the slots a step scheduled have blocks, and each group kind's table has the
shape its kind gives it."""

from __future__ import annotations

from collections.abc import Callable

from kvmodel.invariants.check import StepCheck, fail
from kvmodel.kinds import Kind
from kvmodel.kinds.base import ceil_div


def scheduled_slots_have_blocks(check: StepCheck) -> None:
    """After an admitted step, the request's table in every group covers every token position the
    step asked slots for: computed and new tokens, drafts and lookahead (skipped positions hold the
    null block); an align-mode Mamba group the main model's positions, without the lookahead (a
    drafter has no Mamba layers).

    Guards: draft or lookahead positions left without a block (the target's
    own request, checked without the model)."""
    num_slots = check.sut_result.num_slots
    if not check.sut_result.admitted or num_slots is None:
        return
    request_id: str = getattr(check.op, "request_id", "")  # an admitted step names its request
    tables = check.sut.tables.get(request_id, tuple(() for _ in check.config.groups))
    for group_id, table in enumerate(tables):
        if not check.config.groups[group_id].rules.in_prefix_cache:
            continue  # sized by ring_holds_one_block and cross_attention_holds_encoder_blocks
        block_size = check.config.group_block_size(group_id)
        positions = num_slots
        if check.config.groups[group_id].rules.aligned_states:
            positions -= check.config.num_lookahead_tokens
        if len(table) * block_size < positions:
            fail(
                check,
                "scheduled_slots_have_blocks",
                f"request {request_id} group {group_id} has {len(table)} blocks of {block_size} tokens "
                f"for {positions} scheduled positions",
                ceil_div(positions, block_size),
                len(table),
            )


def _tables_of_kind(check: StepCheck, trait: Callable[[Kind], bool]) -> list[tuple[str, int, tuple[int, ...]]]:
    """(request, group, table) of every request holding blocks, for each group of a kind with ``trait``."""
    group_ids = [g for g, group in enumerate(check.config.groups) if trait(group.rules)]
    if not group_ids:
        return []
    return [(rid, g, tables[g]) for rid, tables in sorted(check.sut.tables.items()) for g in group_ids]


def _uncached_table(
    check: StepCheck, invariant: str, rid: str, group_id: int, table: tuple[int, ...], size: int
) -> None:
    """A group outside the prefix cache holds exactly ``size`` blocks for the request, none null or cached."""
    kind = check.config.groups[group_id].kind
    if len(table) != size or 0 in table:
        fail(
            check,
            invariant,
            f"request {rid} group {group_id} ({kind}) must hold {size} block{'s' * (size != 1)}, none null, while it "
            "holds any",
            size,
            list(table),
        )
    cached = [b for b in table if b in check.sut.block_cache_keys]
    if cached:
        fail(check, invariant, f"request {rid} group {group_id} ({kind}) has blocks in the prefix cache: {cached}")


def ring_holds_one_block(check: StepCheck) -> None:
    """A request holding blocks holds exactly one block in each ring-buffer group, never null and never
    in the prefix cache, whatever its length.

    Guards: a ring group grown like full attention (a block per block of
    tokens); a second ring block claimed on a later step; a ring block
    entered in the prefix cache (the target's own state, checked without
    the model)."""
    for rid, group_id, table in _tables_of_kind(check, lambda kind: kind.scratch_block):
        _uncached_table(check, "ring_holds_one_block", rid, group_id, table, 1)


def cross_attention_holds_encoder_blocks(check: StepCheck) -> None:
    """A request holding blocks holds, in each cross-attention group, exactly the blocks of the
    encoder's tokens (``ceil(num_encoder_tokens / block_size)``), never null and never cached.

    Guards: cross-attention sized by the decoder's tokens; encoder blocks
    allocated again on a later step or lost on preemption (the target's own
    state, checked without the model)."""
    for rid, group_id, table in _tables_of_kind(check, lambda kind: kind.encoder_blocks):
        size = ceil_div(check.config.num_encoder_tokens, check.config.group_block_size(group_id))
        _uncached_table(check, "cross_attention_holds_encoder_blocks", rid, group_id, table, size)


def rswa_keeps_the_prompt(check: StepCheck) -> None:
    """An R-SWA table holds a block at every position of the prompt, and its null blocks form at most
    one run, after the prompt's last block: only the gap between prompt and window is freed.

    Guards: a gap that starts inside the prompt's last (partial) block; a
    gap freed again after new blocks were added past it (the target's own
    state, with its requests' prompt lengths, checked without the model)."""
    for rid, group_id, table in _tables_of_kind(check, lambda kind: kind.keeps_prompt):
        block_size = check.config.group_block_size(group_id)
        prompt_blocks = ceil_div(check.sut.prompt_lengths.get(rid, 0), block_size)
        nulls = [p for p, b in enumerate(table) if b == 0]
        if any(p < prompt_blocks for p in nulls):
            fail(
                check,
                "rswa_keeps_the_prompt",
                f"request {rid} group {group_id} (R-SWA) freed a block of its {prompt_blocks}-block prompt",
                f"blocks at positions 0..{prompt_blocks - 1}",
                list(table),
            )
        if nulls and nulls != list(range(nulls[0], nulls[-1] + 1)):
            fail(
                check,
                "rswa_keeps_the_prompt",
                f"request {rid} group {group_id} (R-SWA) has null blocks in more than one run",
                None,
                list(table),
            )


def mamba_keeps_a_state_tail(check: StepCheck) -> None:
    """A request holding blocks holds, in each Mamba group, null blocks only before its live blocks,
    and at least ``1 + speculative_blocks`` live blocks at the table's end (the last computed token's
    state and the blocks for draft states), none in the prefix cache.

    Guards: speculative blocks not reserved, or reserved once and not kept
    ahead of the slots; a state block freed inside the table; a state
    block entered in the prefix cache (the target's own state, checked
    without the model)."""
    for rid, group_id, table in _tables_of_kind(check, lambda kind: kind.holds_state and not kind.aligned_states):
        spec = check.config.groups[group_id].speculative_blocks
        first_live = next((p for p, b in enumerate(table) if b != 0), len(table))
        if 0 in table[first_live:] or len(table) - first_live < 1 + spec:
            fail(
                check,
                "mamba_keeps_a_state_tail",
                f"request {rid} group {group_id} (Mamba, {spec} speculative) must end in {1 + spec} or more blocks, "
                "with null blocks only before them, while it holds any",
                f"null blocks, then {1 + spec} or more blocks",
                list(table),
            )
        cached = [b for b in table if b != 0 and b in check.sut.block_cache_keys]
        if cached:
            fail(
                check,
                "mamba_keeps_a_state_tail",
                f"request {rid} group {group_id} (Mamba) has blocks in the prefix cache: {cached}",
            )


def mamba_align_keeps_few_states(check: StepCheck) -> None:
    """A request holding blocks in an align-mode Mamba group holds a live block in the table's last
    position, and at most two live blocks (the state a step copies from and the one it writes), one
    more under async scheduling (a step in flight keeps the state it started from), and its
    speculative blocks; with prefill checkpoints, one more per step not yet processed (the checkpoint
    a chunk keeps before its last state); with speculative decode steps, one more per block the
    request's most drafts span (a step's table ends where its drafts end, the allocator records the
    last state there, and frees it only once the processed tokens pass it, so after rejected drafts
    the states of several steps wait); every other position holds the null block.  The block where
    the request's last step saved its state, that of the step's last token (drafts included), is live.

    Guards: null padding off by one (the new state not at the last slot's
    block); positions between states given real blocks, as an attention
    group's are; states behind the processed tokens never freed; a step
    ending short of the table's end after rejected drafts, whose state the
    model runner would save in the null block (the target's own state,
    checked without the model)."""
    in_flight = 1 if check.config.async_scheduling else 0
    for rid, group_id, table in _tables_of_kind(check, lambda kind: kind.aligned_states):
        if not table:
            continue
        group = check.config.groups[group_id]
        checkpoints = 0 if group.prefill_checkpoint_alignment is None else 1 + in_flight
        block_size = check.config.group_block_size(group_id)
        drafts = ceil_div(check.sut.draft_tokens.get(rid, 0), block_size)
        limit = 2 + in_flight + group.speculative_blocks + checkpoints + drafts
        live = [b for b in table if b != 0]
        state_tokens = check.sut.state_tokens.get(rid)
        state = None if state_tokens is None else ceil_div(state_tokens, block_size) - 1
        if state is not None and (state >= len(table) - group.speculative_blocks or table[state] == 0):
            fail(
                check,
                "mamba_align_keeps_few_states",
                f"request {rid} group {group_id} (Mamba, align mode): its last step ended after token "
                f"{state_tokens}, so its state is saved at position {state}, which holds no live block",
                f"a live block at position {state}",
                list(table),
            )
        if table[-1] == 0 or len(live) > limit:
            fail(
                check,
                "mamba_align_keeps_few_states",
                f"request {rid} group {group_id} (Mamba, align mode) must end in a live block and hold at most "
                f"{limit} live blocks, null blocks elsewhere",
                f"at most {limit} live blocks, the last position live",
                list(table),
            )
