"""What a scheduler step adopts and computes for an operation: the scheduler-side rules that turn an
operation into allocator calls (how many tokens a step computes, how many are loaded externally and
whether they supersede a sub-block hit, where a prefill chunk ends beside an align-mode Mamba group), in
:func:`plan_step` and :func:`plan_async_load`.

They are part of the vocabulary every interpreter of an operation shares, the targets' scheduler and
the model alike, so that the two cannot disagree about what an operation asks.
"""

from __future__ import annotations

import attrs

from kvmodel.config import TargetConfig
from kvmodel.ops import Schedule, StartAsyncLoad


@attrs.frozen
class ScheduleAmounts:
    """Tokens a scheduler step adopts and computes: ``hit_length`` is the local hit a waiting request
    adopts (``None`` for a running one), the lookup's or cut back to a block boundary where the
    external tokens supersede its sub-block tail (:func:`plan_load`)."""

    num_new_tokens: int
    num_external_tokens: int
    hit_length: int | None = None


def plan_schedule(
    op: Schedule, num_tokens: int, num_computed_tokens: int, hit_length: int | None, num_output_placeholders: int = 0
) -> ScheduleAmounts:
    """How many tokens the step loads externally and computes.

    ``hit_length`` is the local prefix hit of a waiting request and ``None``
    for a running one.  A waiting request always computes at least one
    token; external tokens only come after its hit and never cover its last
    token.  A running request computes up to its known tokens plus
    ``num_output_placeholders`` (tokens that steps in flight will sample):
    none when every one of them is computed already.
    """
    if hit_length is None:
        return ScheduleAmounts(min(op.num_new_tokens, num_tokens + num_output_placeholders - num_computed_tokens), 0)
    external = max(0, min(op.num_external_tokens, num_tokens - 1 - hit_length))
    new = min(op.num_new_tokens, num_tokens - hit_length - external)
    return ScheduleAmounts(new, external, hit_length)


def plan_load(config: TargetConfig, num_tokens: int, hit_length: int, requested: int) -> tuple[int, int]:
    """The local hit a waiting request adopts and the external tokens a connector loads after it, as
    vLLM 0.33.0's scheduler settles them (``hit_length``: the lookup's hit; ``requested``: the tokens
    the connector has past the hit's last block boundary, never the request's last token).

    The connector is asked past the hit's last scheduler block boundary.  A hit ending inside a
    block (a sub-block hit) is cut back to that boundary (``truncate_computed_blocks``) when the
    load reaches past its end, so the load covers the tail and no block is copied; otherwise the
    hit is kept whole and nothing is loaded.  Beside an align-mode Mamba group the load is trimmed
    until its end lies inside a block of every such group (:func:`ends_inside_state_blocks`)."""
    tail = hit_length % config.scheduler_block_size
    aligned = hit_length - tail
    external = max(0, min(requested, num_tokens - 1 - aligned))
    while external > 0 and not ends_inside_state_blocks(config, aligned + external):
        external -= 1
    if not tail:
        return hit_length, external
    return (aligned, external) if external > tail else (hit_length, 0)


def ends_inside_state_blocks(config: TargetConfig, num_tokens: int) -> bool:
    """Whether ``num_tokens`` tokens end inside a block (not on its boundary) of every align-mode Mamba
    group.  vLLM 0.33.0's admission counts one new block for such a group's state, but external
    tokens take a block of their own for their last state first: a step that computes past that
    block takes a second one nobody counted, and the pool can run dry inside ``allocate_slots``
    (``tests/vllm/test_known_defects.py``).  kvcheck's drivers load external tokens beside such a
    group only where the load's last state and the step's share one block: the load ends inside a
    block, and the step's chunk ends in it (:func:`plan_step`)."""
    return all(num_tokens % config.group_block_size(g) for g in config.aligned_mamba_group_ids)


def split_at_mamba_states(
    amounts: ScheduleAmounts,
    op: Schedule,
    start: int,
    num_tokens: int,
    num_prompt_tokens: int,
    shared_prefix_boundary: int,
    config: TargetConfig,
) -> ScheduleAmounts:
    """The step's new tokens clipped as vLLM 0.33.0's scheduler clips a prefill chunk beside an
    align-mode Mamba group, where states exist only on block boundaries (``_mamba_block_aligned_split``,
    with no prefill checkpoints).

    ``start`` is where the chunk starts (computed, hit and external tokens).
    Until the prefill ends (the prompt, or all but the last token of a
    resumed request) a chunk ends on a block boundary when it reaches one,
    and never runs past the next boundary when it starts inside a block (a
    block wider than the step's ``num_new_tokens``, which stands for the
    scheduler's token budget, advances inside the block).  It also stops at
    the last boundary the request can cache and at the block boundary below
    the end of a prefix a lookup found shared (``shared_prefix_boundary``; at
    that end itself, within the prompt, with shared-prefix checkpoints).
    With sub-block hits it also stops at the prompt's last hash boundary
    past that block boundary, where the state a later request hits inside a
    block is cached.
    """
    prefill_end = max(num_prompt_tokens, num_tokens - 1)
    if start >= prefill_end:
        return amounts
    block_size = config.scheduler_block_size
    end = start + amounts.num_new_tokens
    lookahead, drop = config.num_hash_lookahead_tokens, config.use_eagle
    last_cacheable = reusable_boundary(num_tokens, block_size, lookahead, drop)
    # A chunk reaching the prefill's end whose backend exports the checkpoint inside it stops nowhere
    # for a state (but a shared prefix's end).
    checkpoint_step = config.hash_size if config.partial_hits else block_size
    checkpoint = reusable_boundary(prefill_end, checkpoint_step, lookahead, drop)
    internal = end >= prefill_end and prefill_checkpoint_fits(
        config.prefill_checkpoint_alignment, block_size, config.hash_size, start, end, checkpoint
    )
    if internal:
        last_cacheable = 0
    if end < prefill_end:
        aligned_end = end // block_size * block_size
        if aligned_end > start or block_size <= op.num_new_tokens:
            end = aligned_end
    partial_tail = config.partial_hits and not internal
    tail = reusable_boundary(num_prompt_tokens, config.hash_size, lookahead, drop) if partial_tail else 0
    junction = shared_prefix_boundary
    # With shared-prefix checkpoints the state at the junction itself is cached (within the prompt);
    # otherwise only the block boundary below it holds a state.
    exact_junction = config.shared_prefix_checkpoint and junction <= num_prompt_tokens
    junction_stop = junction if exact_junction else start + (junction - start) // block_size * block_size
    stops = (
        (start // block_size + 1) * block_size if start % block_size and not internal else 0,
        last_cacheable,
        tail if last_cacheable < tail < num_prompt_tokens else 0,
        junction_stop if start < junction < end else 0,
    )
    end = min((stop for stop in stops if start < stop < end), default=end)
    return attrs.evolve(amounts, num_new_tokens=max(end - start, 0))


def reusable_boundary(num_tokens: int, step: int, lookahead: int, drop: bool) -> int:
    """The last multiple of ``step`` whose Mamba state a later request can reuse, of a prefix of
    ``num_tokens`` tokens (vLLM 0.33.0's ``get_mamba_prefill_checkpoint_position``): short of the last
    token and of the ``lookahead`` tokens hashes look ahead, or, with an EAGLE drafter's drop
    (``drop``), one ``step`` below the last multiple, where the attention groups' hits land."""
    if drop:
        return max(0, num_tokens // step * step - step)
    return max(0, (num_tokens - max(1, lookahead)) // step * step)


def prefill_checkpoint_fits(
    alignment: int | None, block_size: int, hash_size: int, start: int, end: int, checkpoint: int
) -> bool:
    """Whether the backend exports, inside a chunk from ``start`` to ``end``, the state after ``checkpoint``
    tokens (vLLM 0.33.0's ``is_mamba_prefill_checkpoint_valid``, on ``block_size``-token state blocks):
    the chunk starts on a hash boundary, the checkpoint lies a hash block or more past its start, before
    its end, a multiple of ``alignment`` tokens past its start (``None``: never), and in a block after
    the one holding the state the chunk starts from."""
    if alignment is None:
        return False
    return (
        start % hash_size == 0
        and -(-end // block_size) - 2 > (start - 1) // block_size
        and start + hash_size <= checkpoint < end
        and (checkpoint - start) % alignment == 0
    )


def plan_step(
    op: Schedule,
    config: TargetConfig,
    num_tokens: int,
    num_computed_tokens: int,
    num_prompt_tokens: int,
    shared_prefix_boundary: int,
    hit_length: int | None,
    num_output_placeholders: int = 0,
) -> ScheduleAmounts:
    """:func:`plan_schedule` as ``config`` schedules: a waiting request's hit and external tokens settled
    by :func:`plan_load`, and beside an align-mode Mamba group a chunk after a load ending in the load's
    last state block, and prefill chunks split at Mamba states (:func:`split_at_mamba_states`)."""
    if hit_length is not None:
        hit_length, external = plan_load(config, num_tokens, hit_length, op.num_external_tokens)
        op = attrs.evolve(op, num_external_tokens=external)
    amounts = plan_schedule(op, num_tokens, num_computed_tokens, hit_length, num_output_placeholders)
    if not config.has_aligned_mamba:
        return amounts
    start = num_computed_tokens + (hit_length or 0) + amounts.num_external_tokens
    if amounts.num_external_tokens:
        # The step's chunk ends in the block holding the load's last state, in every align-mode group.
        end = min(-(-start // size) * size for size in map(config.group_block_size, config.aligned_mamba_group_ids))
        amounts = attrs.evolve(amounts, num_new_tokens=min(amounts.num_new_tokens, end - start))
    return split_at_mamba_states(amounts, op, start, num_tokens, num_prompt_tokens, shared_prefix_boundary, config)


def ends_short_of_its_state(config: TargetConfig, state_tokens: int | None, end: int) -> bool:
    """Whether a step of a running request, ending after ``end`` tokens (drafts included), saves an
    align-mode Mamba group's state in an earlier block than the request's last step did (which ran up
    to ``state_tokens``, its drafts included; ``None``: no step since the request was admitted).

    vLLM's model runner saves a step's state in the block of its last token.  After rejected drafts
    that block lies before the table's end, where vLLM 0.33.0's allocator padded the null block and
    allocates nothing, so the state would go to the null block (``tests/vllm/test_known_defects.py``).
    A drafter proposing as many tokens every step never schedules such a step, and kvcheck runs none:
    both targets and the model leave it undone."""
    if state_tokens is None:
        return False
    return any(
        -(-end // size) < -(-state_tokens // size)
        for size in map(config.group_block_size, config.aligned_mamba_group_ids)
    )


def plan_async_load(op: StartAsyncLoad, config: TargetConfig, num_tokens: int, hit_length: int) -> tuple[int, int]:
    """The hit a waiting request adopts and the tokens an asynchronous load brings after it
    (:func:`plan_load`): never its last token."""
    return plan_load(config, num_tokens, hit_length, op.num_external_tokens)
