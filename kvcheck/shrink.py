"""Shrinking a failing run to a minimal one that fails the same way.

A candidate is kept when replaying it from scratch raises a violation of
the same invariant; any other outcome (a clean run, an operation the target
rejects) discards it.  Passes repeat until none makes progress: delete
operations, simplify their arguments, simplify the configuration, and
finally rename requests in order of appearance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs

from kvcheck.kinds import kind_of
from kvcheck.kinds.full import FULL
from kvcheck.lockstep import Lockstep
from kvcheck.swarm import Failure
from kvcheck.targets import TargetFactory
from kvmodel.config import TargetConfig
from kvmodel.config_checks import ConfigError
from kvmodel.invariants import InvariantViolation
from kvmodel.ops import (
    REQUEST_OPERATIONS,
    AddRequest,
    EvictBlocks,
    Operation,
    Schedule,
    SpecDecode,
    StartAsyncLoad,
    first_reference_error,
)

Ops = tuple[Operation, ...]

MAX_POOL_CUT = 8
"""The most blocks the pool is cut by when a request or a group is dropped with it."""

_NAMED_OPERATIONS = (AddRequest, *REQUEST_OPERATIONS)
"""Every operation that names a request by ``request_id``."""


def replay_violation(make_target: TargetFactory, config: TargetConfig, ops: Ops) -> InvariantViolation | None:
    """The violation replaying ``ops`` raises, or ``None`` (also when an operation refers to nothing)."""
    if first_reference_error(ops, config.num_blocks) is not None:
        return None
    try:
        lockstep = Lockstep(make_target, config)
        for op in ops:
            lockstep.step(op)
    except InvariantViolation as violation:
        return violation
    except Exception:  # a candidate the target rejects is simply not kept
        return None
    return None


def _op_simplifications(op: Operation) -> Iterator[Operation]:
    if isinstance(op, Schedule):
        if op.num_external_tokens:
            yield attrs.evolve(op, num_external_tokens=0)
            yield attrs.evolve(op, num_external_tokens=op.num_external_tokens - 1)
        for smaller in (1, op.num_new_tokens // 2, op.num_new_tokens - 1):
            if 1 <= smaller < op.num_new_tokens:
                yield attrs.evolve(op, num_new_tokens=smaller)
        if op.sampled_token:
            yield attrs.evolve(op, sampled_token=0)
        if op.same_step:
            yield attrs.evolve(op, same_step=False)
    elif isinstance(op, SpecDecode):
        if op.num_draft_tokens > 1:
            yield attrs.evolve(
                op,
                num_draft_tokens=op.num_draft_tokens - 1,
                num_accepted_tokens=min(op.num_accepted_tokens, op.num_draft_tokens - 1),
            )
        if op.num_accepted_tokens:
            yield attrs.evolve(op, num_accepted_tokens=op.num_accepted_tokens - 1)
        if op.sampled_token:
            yield attrs.evolve(op, sampled_token=0)
    elif isinstance(op, StartAsyncLoad):
        # A plain step with the same external tokens is simpler to read.
        yield Schedule(op.request_id, 1, op.num_external_tokens)
        if op.num_external_tokens > 1:
            yield attrs.evolve(op, num_external_tokens=1)
            yield attrs.evolve(op, num_external_tokens=op.num_external_tokens - 1)
    elif isinstance(op, AddRequest):
        for index in range(len(op.prompt) - 1, -1, -1):
            if len(op.prompt) > 1:
                yield attrs.evolve(op, prompt=op.prompt[:index] + op.prompt[index + 1 :])
        for index, token in enumerate(op.prompt):
            if token:
                yield attrs.evolve(op, prompt=(*op.prompt[:index], 0, *op.prompt[index + 1 :]))
    elif isinstance(op, EvictBlocks) and len(op.block_ids) > 1:
        for index in range(len(op.block_ids)):
            yield attrs.evolve(op, block_ids=op.block_ids[:index] + op.block_ids[index + 1 :])


def config_simplifications(config: TargetConfig) -> Iterator[TargetConfig]:
    """Configurations a step simpler than ``config`` (fewer groups, a smaller pool, plainer features);
    a candidate may not validate."""
    if config.async_scheduling:
        yield attrs.evolve(config, async_scheduling=False, defer_block_free=False)
    if config.defer_block_free:
        yield attrs.evolve(config, defer_block_free=False)
    if config.reserve_full_sequence:
        yield attrs.evolve(config, reserve_full_sequence=False, max_in_flight_tokens=None)
    if config.max_in_flight_tokens is not None:
        yield attrs.evolve(config, max_in_flight_tokens=None)
    if config.reserved_blocks:
        yield attrs.evolve(config, reserved_blocks=0)
    if config.watermark:
        yield attrs.evolve(config, watermark=0.0)
    if config.enable_kv_cache_events:
        yield attrs.evolve(config, enable_kv_cache_events=False)
    if config.use_eagle:
        yield attrs.evolve(config, use_eagle=False)
    if config.eagle_group_ids:
        yield attrs.evolve(config, eagle_group_ids=())
    if config.num_hash_lookahead_tokens:
        yield attrs.evolve(config, num_hash_lookahead_tokens=0)
    if config.num_prefill_lookahead:
        yield attrs.evolve(config, num_prefill_lookahead=0)
        if config.num_prefill_lookahead > 1:
            yield attrs.evolve(config, num_prefill_lookahead=config.num_prefill_lookahead - 1)
    if config.num_lookahead_tokens:
        yield attrs.evolve(config, num_lookahead_tokens=0)
        if config.num_lookahead_tokens > 1:
            yield attrs.evolve(config, num_lookahead_tokens=config.num_lookahead_tokens - 1)
    if len(config.groups) > 1:
        for index in range(len(config.groups)):
            drafters = tuple(g - (g > index) for g in config.eagle_group_ids if g != index)
            if drafters or not config.eagle_group_ids:
                groups = config.groups[:index] + config.groups[index + 1 :]
                encoder = config.num_encoder_tokens if any(g.rules.encoder_blocks for g in groups) else 0
                fewer_groups = attrs.evolve(config, groups=groups, eagle_group_ids=drafters, num_encoder_tokens=encoder)
                yield fewer_groups
                # The dropped group's blocks may have been what made the pool tight: a smaller one too.
                for fewer in range(1, min(MAX_POOL_CUT, config.num_blocks - 2) + 1):
                    yield attrs.evolve(fewer_groups, num_blocks=config.num_blocks - fewer)
    # One block size, and hashes as large as the blocks.
    if config.hash_block_size is not None:
        yield attrs.evolve(config, hash_block_size=None)
    if config.mixed_block_sizes:
        yield attrs.evolve(config, groups=tuple(attrs.evolve(group, block_size=None) for group in config.groups))
    for index, group in enumerate(config.groups):
        if group.block_size is not None:
            same = attrs.evolve(group, block_size=None)
            yield attrs.evolve(config, groups=(*config.groups[:index], same, *config.groups[index + 1 :]))
    for smaller in (4, config.num_blocks // 2, config.num_blocks - 1):
        if 2 <= smaller < config.num_blocks:
            yield attrs.evolve(config, num_blocks=smaller)
    if config.num_encoder_tokens > 1:
        yield attrs.evolve(config, num_encoder_tokens=1)
        yield attrs.evolve(config, num_encoder_tokens=config.num_encoder_tokens - 1)
    for index, group in enumerate(config.groups):
        kind = kind_of(group.kind)
        if group.window is not None:
            block_size = config.group_block_size(index)
            step = kind.window_step(block_size)
            floor = kind.window_floor(block_size)
            for window in (floor, group.window - step):
                if floor <= window < group.window:
                    smaller_group = attrs.evolve(group, window=window)
                    yield attrs.evolve(
                        config, groups=(*config.groups[:index], smaller_group, *config.groups[index + 1 :])
                    )
        for fewer in sorted({0, group.speculative_blocks - 1}):
            if 0 <= fewer < group.speculative_blocks:
                smaller_group = attrs.evolve(group, speculative_blocks=fewer)
                yield attrs.evolve(config, groups=(*config.groups[:index], smaller_group, *config.groups[index + 1 :]))
        if group.prefill_checkpoint_alignment is not None:
            # No checkpoints first, then checkpoints a backend exports anywhere.
            for alignment in sorted({None, 1} - {group.prefill_checkpoint_alignment}, key=lambda a: a or 0):
                simpler = attrs.evolve(group, prefill_checkpoint_alignment=alignment)
                yield attrs.evolve(config, groups=(*config.groups[:index], simpler, *config.groups[index + 1 :]))
        if kind.shrinks_to_full:
            full = attrs.evolve(
                group, kind=FULL.name, window=None, speculative_blocks=0, prefill_checkpoint_alignment=None
            )
            yield attrs.evolve(config, groups=(*config.groups[:index], full, *config.groups[index + 1 :]))


def _rename_requests(ops: Ops) -> Ops:
    names: dict[str, str] = {}
    for op in ops:
        if isinstance(op, AddRequest):
            names.setdefault(op.request_id, f"r{len(names)}")
    renamed: list[Operation] = []
    for op in ops:
        if isinstance(op, _NAMED_OPERATIONS) and op.request_id in names:
            renamed.append(attrs.evolve(op, request_id=names[op.request_id]))
        else:
            renamed.append(op)
    return tuple(renamed)


def _request_ids(ops: Ops) -> list[str]:
    return [op.request_id for op in ops if isinstance(op, AddRequest)]


def _without_request(ops: Ops, request_id: str) -> Ops:
    return tuple(op for op in ops if getattr(op, "request_id", None) != request_id)


def _appended(op: Operation) -> tuple[int, ...]:
    """The tokens a decode step appends (run at the request's last token)."""
    if isinstance(op, SpecDecode):
        return (op.sampled_token,) * (min(op.num_accepted_tokens, op.num_draft_tokens) + 1)
    assert isinstance(op, Schedule)
    return (op.sampled_token,)


def _folded_decodes(ops: Ops) -> Iterator[Ops]:
    """A request's first decode steps folded into its prompt: the prompt grows by the tokens they
    appended, the request's first step computes those too, and they are dropped (the most first).
    A request that only grew a token at a time then reaches the same length in one step."""
    for add_index, add in enumerate(ops):
        if not isinstance(add, AddRequest):
            continue
        own = [i for i in range(add_index + 1, len(ops)) if getattr(ops[i], "request_id", None) == add.request_id]
        if not own or not isinstance(ops[own[0]], Schedule):
            continue
        first = ops[own[0]]
        assert isinstance(first, Schedule)
        run = []
        for i in own[1:]:
            op = ops[i]
            if not isinstance(op, SpecDecode) and not (
                isinstance(op, Schedule) and op.num_new_tokens == 1 and not op.num_external_tokens
            ):
                break
            run.append(i)
        for count in range(len(run), 0, -1):
            folded = run[:count]
            grown = add.prompt + _appended(first) + sum((_appended(ops[i]) for i in folded[:-1]), ())
            computed = sum(len(_appended(ops[i])) for i in folded)
            last = ops[folded[-1]]
            assert isinstance(last, (Schedule, SpecDecode))
            step = attrs.evolve(first, num_new_tokens=first.num_new_tokens + computed, sampled_token=last.sampled_token)
            replaced: dict[int, Operation] = {add_index: attrs.evolve(add, prompt=grown), own[0]: step}
            yield tuple(replaced.get(i, op) for i, op in enumerate(ops) if i not in folded)


def _merge_request(ops: Ops, gone: str, into: str) -> Ops:
    """``gone``'s arrival dropped and its later operations addressed to ``into`` instead."""
    merged: list[Operation] = []
    for op in ops:
        if isinstance(op, AddRequest) and op.request_id == gone:
            continue
        if isinstance(op, _NAMED_OPERATIONS) and op.request_id == gone:
            merged.append(attrs.evolve(op, request_id=into))
        else:
            merged.append(op)
    return tuple(merged)


def shrink(make_target: TargetFactory, failure: Failure, max_attempts: int = 20_000) -> Failure:
    """A minimal failure of the same invariant as ``failure``."""
    invariant = failure.violation.invariant
    config, ops, violation = failure.config, failure.ops, failure.violation
    attempts = 0

    def accept(candidate_config: TargetConfig, candidate_ops: Ops) -> bool:
        nonlocal config, ops, violation, attempts
        attempts += 1
        found = replay_violation(make_target, candidate_config, candidate_ops)
        if found is None or found.invariant != invariant:
            return False
        # Everything after the failing step is dead weight.
        config, ops, violation = candidate_config, candidate_ops[: found.step], found
        return True

    passes: list[Callable[[], bool]] = []

    def delete_ops() -> bool:
        progress = False
        size = max(1, len(ops) // 2)
        while size >= 1:
            index = 0
            while index < len(ops) and attempts < max_attempts:
                if accept(config, ops[:index] + ops[index + size :]):
                    progress = True
                else:
                    index += 1
            size //= 2
        return progress

    def delete_ops_with_blocks() -> bool:
        """Steps that only grew a request (a block each) dropped with as many blocks of the pool."""
        size = max(1, len(ops) // 2)
        while size >= 1:
            for index in range(len(ops) - size):
                if attempts >= max_attempts or config.num_blocks - size < 2:
                    return False
                smaller = attrs.evolve(config, num_blocks=config.num_blocks - size)
                if accept(smaller, ops[:index] + ops[index + size :]):
                    return True
            size //= 2
        return False

    def fold_decodes() -> bool:
        for folded in _folded_decodes(ops):
            if attempts >= max_attempts:
                return False
            if accept(config, folded):
                return True
        return False

    def drop_requests() -> bool:
        for request_id in _request_ids(ops):
            if attempts >= max_attempts:
                return False
            if accept(config, _without_request(ops, request_id)):
                return True
        # A request whose only part was to hold some blocks is dropped with a pool that much smaller.
        for request_id in _request_ids(ops):
            for fewer in range(1, MAX_POOL_CUT + 1):
                if config.num_blocks - fewer < 2 or attempts >= max_attempts:
                    break
                smaller = attrs.evolve(config, num_blocks=config.num_blocks - fewer)
                if accept(smaller, _without_request(ops, request_id)):
                    return True
        for gone in _request_ids(ops):
            for into in _request_ids(ops):
                if gone != into and attempts < max_attempts and accept(config, _merge_request(ops, gone, into)):
                    return True
        return False

    def simplify_ops() -> bool:
        progress = False
        for index in range(len(ops)):
            for simpler in _op_simplifications(ops[index]) if index < len(ops) else ():
                if attempts >= max_attempts:
                    return progress
                if accept(config, (*ops[:index], simpler, *ops[index + 1 :])):
                    progress = True
                    break
        return progress

    def simplify_config() -> bool:
        for simpler in config_simplifications(config):
            if attempts >= max_attempts:
                return False
            try:
                simpler.validate()  # e.g. no drafter group named beside a chunked-local group
            except ConfigError:
                continue
            if simpler.block_size == config.block_size and accept(simpler, ops):
                return True
        return False

    passes = [delete_ops, drop_requests, fold_decodes, delete_ops_with_blocks, simplify_ops, simplify_config]
    while attempts < max_attempts and any([p() for p in passes]):
        pass
    renamed = _rename_requests(ops)
    final = replay_violation(make_target, config, renamed)
    if final is not None and final.invariant == invariant:
        ops, violation = renamed, final
    return Failure(config, ops, violation)
