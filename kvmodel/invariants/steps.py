"""The invariants of what a step hands the worker: the blocks steps in flight read, block copies, states offered a
connector and blocks to zero."""

from __future__ import annotations

from kvmodel.invariants.against_model import same_state_offloads, same_zeroed_blocks
from kvmodel.invariants.check import StepCheck, fail
from kvmodel.kinds.base import ceil_div
from kvmodel.ops import Finish, StartAsyncLoad


def in_flight_blocks_held(check: StepCheck) -> None:
    """Every block position a step still in flight reads or writes holds a block, and that block is
    still held: by the request's table at the same position, or by a deferred free.

    Steps of a request freed since they were scheduled are exempt unless
    frees are deferred (without deferral the scheduler frees at once, and
    the device's stream order protects the step).

    Guards: a window's blocks released on the scheduled rather than the
    processed token count; a deferred free returned to the pool before its
    step (the target's own state, checked without the model)."""
    deferred = {b for popped in check.sut.deferred_frees for b in popped}
    for request_id, reads in check.sut.in_flight_reads:
        table = check.sut.tables.get(request_id, ())
        for group_id, blocks in enumerate(reads):
            held = table[group_id] if group_id < len(table) else ()
            for block_id in blocks:
                if block_id == 0:
                    fail(
                        check,
                        "in_flight_blocks_held",
                        f"a step of request {request_id} in flight reads a position of group {group_id} "
                        f"that held no block when it was scheduled (reads {list(blocks)})",
                    )
                if block_id not in held and block_id not in deferred:
                    state = "free" if block_id in check.sut.free_order else "held elsewhere"
                    fail(
                        check,
                        "in_flight_blocks_held",
                        f"block {block_id} of group {group_id}, read by a step of request {request_id} still "
                        f"in flight, is {state}: neither in the request's table nor in a deferred free",
                    )


def block_copies_well_formed(check: StepCheck) -> None:
    """Every block copy a step queues copies a block the prefix cache shares into a block of the
    request's own: for a waiting request's hit ending inside a group's block, from that hit block into
    the block its table now holds there; otherwise (a state the running request cached inside the block
    it goes on writing) from a block its table still holds into a block no table holds, which the cache
    keeps instead (under keys the source no longer has).  A copy's two blocks differ and are not null.
    Model-free.

    Guards: a copy into a block a table still shares; a copy whose source is not the shared block; a
    state's cache entry left on the block its request overwrites."""
    result = check.sut_result
    if not result.block_copies:
        return
    request_id: str = getattr(check.op, "request_id", "")  # an admitted step names its request
    tables = check.sut.tables.get(request_id, ())
    held = {block for table in tables for block in table if block}
    held_by_any = {block for groups in check.sut.tables.values() for table in groups for block in table if block}
    hit_sources: dict[int, int] = {}
    if result.hit_length and result.hit_block_ids is not None:
        for group_id, hit in enumerate(result.hit_block_ids):
            block_size = check.config.group_block_size(group_id)
            position = result.hit_length // block_size
            if result.hit_length % block_size and position < len(hit) and hit[position]:
                destination = (
                    tables[group_id][position] if group_id < len(tables) and position < len(tables[group_id]) else 0
                )
                hit_sources[hit[position]] = destination
    for source, destination in result.block_copies:
        if not source or not destination or source == destination:
            fail(check, "block_copies_well_formed", f"copy {source} -> {destination} is not between two blocks")
        if source in hit_sources:
            if hit_sources[source] != destination:
                fail(
                    check,
                    "block_copies_well_formed",
                    f"request {request_id}'s hit block {source} is copied into block {destination}, not the block "
                    "its table holds where the hit ends",
                    hit_sources[source],
                    destination,
                )
            continue
        if source not in held:
            fail(
                check,
                "block_copies_well_formed",
                f"copy {source} -> {destination} of request {request_id}: the source is neither its hit's shared "
                "block nor a block of its table",
            )
        keys = check.sut.block_cache_keys
        shared_keys = set(keys.get(source, ())) & set(keys.get(destination, ()))
        if destination in held_by_any or shared_keys:
            fail(
                check,
                "block_copies_well_formed",
                f"request {request_id}'s block {source} is copied into block {destination} for the cache to keep, "
                f"but a table holds the copy or both are cached under {sorted(shared_keys, key=repr)}",
            )


def state_offloads_well_formed(check: StepCheck) -> None:
    """Every boundary state the allocator offers a KV connector (``take_boundary_state_offloads``, and a
    finishing request's ``finalize_partial_tail_offloads``) names an align-mode Mamba group, a block that
    is not the null block, and a hash boundary; after any step but a request's finish, a block its
    request's table in that group holds, or a block copied from one in the step; never, for a state the
    step copies for the cache, the block copied from (its request goes on writing it: the copy, cached
    under that boundary, keeps the state).  Checked on the target's own state, then against the model's
    list (order included).  The offered blocks are not checked by position: an align-mode table keeps a
    prefill checkpoint before its last state, which is why the allocator names the blocks.

    Guards: a connector handed the block a state was cached inside instead of its copy (it offloads
    whatever the next step writes there); a state offered under the wrong boundary or group; a
    finishing request's state offered after later tokens reached its block; offers of a freed request
    left queued."""
    _state_offloads_on_the_target(check)
    same_state_offloads(check)


def _state_offloads_on_the_target(check: StepCheck) -> None:
    offloads = check.sut_result.state_offloads
    if not offloads:
        return
    config = check.config
    sources = {source: destination for source, destination in check.sut_result.block_copies}
    destinations = {destination: source for source, destination in check.sut_result.block_copies}
    finishing = isinstance(check.op, Finish)
    lookahead = config.num_hash_lookahead_tokens
    for request_id, group_id, block_id, num_tokens in offloads:
        offer = f"request {request_id}'s state after {num_tokens} tokens in group {group_id}, block {block_id}"
        if not 0 <= group_id < len(config.groups) or not config.groups[group_id].rules.aligned_states:
            fail(check, "state_offloads_well_formed", f"{offer} is offered from a group that is not align-mode Mamba")
        if not block_id or num_tokens <= 0 or num_tokens % config.hash_size:
            fail(
                check,
                "state_offloads_well_formed",
                f"{offer} is offered on the null block or off a hash boundary (hashes of {config.hash_size})",
            )
        copy_keys = check.sut.block_cache_keys.get(sources.get(block_id, 0), ())
        if any(key[0] == group_id and len(key[1]) - lookahead == num_tokens for key in copy_keys):
            fail(
                check,
                "state_offloads_well_formed",
                f"{offer} is offered from the block the step copies into block {sources[block_id]}, cached under "
                "that boundary: its request goes on writing the offered block, the copy keeps the state",
                sources[block_id],
                block_id,
            )
        if finishing:
            continue  # the finished request's table is gone: the model's list says which block
        tables = check.sut.tables.get(request_id, ())
        table = set(tables[group_id]) - {0} if group_id < len(tables) else set()
        if block_id not in table and destinations.get(block_id) not in table:
            fail(
                check,
                "state_offloads_well_formed",
                f"{offer} is offered, but its table in that group does not hold the block (nor a block copied into it)",
                sorted(table),
                block_id,
            )


def zeroed_blocks_are_fresh(check: StepCheck) -> None:
    """The blocks a step hands the worker to zero are exactly the fresh blocks of attention groups
    (not ring buffers, not Mamba states), when the cache needs zeroing: every block the allocation
    returned (a copy on write's new block included) and the blocks of a synchronous load's external
    tokens; never a block holding data the step reads: a hit block, a copy's source, another request's
    block, a block taken before the step, or a block an asynchronous load writes after the step
    (zeroing it races the load).  None at all when the cache needs no zeroing.  Checked on the
    target's own state, then against the model's list (in the allocator's order).

    Guards: zeroing a prefix hit or a copy's source (the cached tokens wiped before they are read); a
    record never emptied, so a later step zeroes blocks holding computed tokens; new blocks left
    unzeroed; an asynchronous load's blocks zeroed under it."""
    _zeroed_blocks_fresh_on_the_target(check)
    same_zeroed_blocks(check)


def _zeroed_blocks_fresh_on_the_target(check: StepCheck) -> None:
    result = check.sut_result
    zeroed = result.zeroed_block_ids
    config = check.config
    request_id: str = getattr(check.op, "request_id", "")  # an admitted step names its request
    tables = check.sut.tables.get(request_id, ())
    if not config.needs_zeroing:
        if zeroed:
            detail = "blocks handed over for zeroing by a cache that needs none"
            fail(check, "zeroed_blocks_are_fresh", detail, (), zeroed)
        return
    zeroed_groups = config.zeroed_group_ids
    # The hit blocks the request took (a window may skip some, which the allocation may then reuse).
    hit = {
        block
        for group, table in zip(result.hit_block_ids or (), tables)
        for block, held in zip(group, table)
        if block and block == held
    }
    if zeroed:
        _zeroed_blocks_hold_no_data(check, request_id, tables, hit)
    if not result.admitted:
        return
    # The fresh blocks: those the allocation returned, then (below) a synchronous load's.
    new_ids = result.new_block_ids or ()
    expected = {block for group_id, ids in enumerate(new_ids) if group_id in zeroed_groups for block in ids if block}
    if result.num_external_tokens and tables:
        loads_later = isinstance(check.op, StartAsyncLoad)
        end = (result.hit_length or 0) + result.num_external_tokens
        for group_id in sorted(zeroed_groups):
            group = config.groups[group_id]
            if group.rules.encoder_blocks:
                continue  # its blocks hold the encoder's tokens, not loaded ones
            # A load writes the tokens past the hit that the group still reads.
            start = max(result.hit_length or 0, group.first_attended_token(end))
            if start >= end:
                continue
            block_size = config.group_block_size(group_id)
            loaded = {block for block in tables[group_id][start // block_size : ceil_div(end, block_size)] if block}
            loaded -= hit
            if loads_later and group_id in config.async_loaded_group_ids:
                written = loaded & set(zeroed)
                if written:
                    fail(
                        check,
                        "zeroed_blocks_are_fresh",
                        f"group {group_id}: blocks {sorted(written)} an asynchronous load writes after the step "
                        "are handed over for zeroing",
                        None,
                        zeroed,
                    )
            elif not loads_later:
                expected |= loaded
    missing = expected - set(zeroed)
    if missing:
        fail(
            check,
            "zeroed_blocks_are_fresh",
            f"fresh blocks {sorted(missing)} of request {request_id} are not handed over for zeroing",
            sorted(expected),
            zeroed,
        )
    stale = set(zeroed) - expected
    if stale:
        fail(
            check,
            "zeroed_blocks_are_fresh",
            f"blocks {sorted(stale)} of request {request_id} that the step did not take fresh are handed over "
            "for zeroing",
            sorted(expected),
            zeroed,
        )


def _zeroed_blocks_hold_no_data(
    check: StepCheck, request_id: str | None, tables: tuple[tuple[int, ...], ...], hit: set[int]
) -> None:
    """Fail on the first block handed over for zeroing that holds data the step reads, saying why."""
    zeroed = check.sut_result.zeroed_block_ids
    zeroed_groups = check.config.zeroed_group_ids
    own = {block for group_id, table in enumerate(tables) if group_id in zeroed_groups for block in table if block}
    sources = {source for source, _ in check.sut_result.block_copies}
    others = {
        block
        for rid, groups in check.sut.tables.items()
        if rid != request_id
        for table in groups
        for block in table
        if block
    }
    for block in zeroed:
        reason = (
            "the source of a block copy"
            if block in sources
            else "a block of the step's hit"
            if block in hit
            else "held by another request"
            if block in others
            else f"not in a zeroed group of request {request_id}'s tables"
            if block not in own
            else None
        )
        if reason is not None:
            fail(check, "zeroed_blocks_are_fresh", f"block {block} is handed over for zeroing: {reason}", None, zeroed)
