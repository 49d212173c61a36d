"""The named invariants every step must keep.

Each invariant is a function of a :class:`StepCheck`: the step's operation,
what the target and the model returned, and both observations.  It raises
:class:`InvariantViolation` naming itself, the step, the block or request,
and expected against actual.  ``ALL_INVARIANTS`` lists them in checking
order: the target's own consistency first, then its agreement with the model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs

from kvmodel.config import TargetConfig
from kvmodel.kinds import Kind
from kvmodel.kinds.base import ceil_div
from kvmodel.observation import CacheEvent, ClearedEvent, Observation, RemovedEvent, StoredEvent
from kvmodel.ops import Finish, Operation, Schedule, StartAsyncLoad, StepResult, describe_op


@attrs.define(eq=False)
class EventReplay:
    """The target's KV cache event stream as replayed so far: the events taken and the (group, prefix)
    entries they leave.  A :class:`~kvcheck.lockstep.Lockstep` carries one from step to step, so
    :func:`events_match_cache` replays each new event once, not the whole stream at every step."""

    replayed: tuple[CacheEvent, ...] = ()
    view: Counter[tuple[int, tuple[int, ...]]] = attrs.Factory(Counter)

    def continues(self, events: tuple[CacheEvent, ...]) -> bool:
        """Whether ``events`` is the stream replayed so far with events appended (the prefix is compared
        in full: a target's events are the same objects from step to step, so this is quick)."""
        return events[: len(self.replayed)] == self.replayed

    def restart(self) -> None:
        self.replayed = ()
        self.view.clear()


@attrs.frozen
class StepCheck:
    """Everything the invariants may look at after one step.

    ``event_replay`` is the event stream replayed at the previous full check of the same run (``None``:
    replay it from the start)."""

    step: int
    op: Operation
    config: TargetConfig
    sut_result: StepResult
    model_result: StepResult
    sut: Observation
    model: Observation
    event_replay: EventReplay | None = None


@attrs.define(auto_exc=True, str=False)
class InvariantViolation(AssertionError):
    """An invariant failed after a step."""

    invariant: str
    step: int
    op: str
    detail: str
    expected: object = None
    actual: object = None

    def __str__(self) -> str:
        lines = [f"{self.invariant} violated at step {self.step} ({self.op}): {self.detail}"]
        if self.expected is not None or self.actual is not None:
            lines.append(f"  expected: {self.expected!r}")
            lines.append(f"  actual:   {self.actual!r}")
        return "\n".join(lines)


def _fail(check: StepCheck, invariant: str, detail: str, expected: object = None, actual: object = None) -> None:
    raise InvariantViolation(invariant, check.step, describe_op(check.op), detail, expected, actual)


def no_duplicate_block_ids(check: StepCheck) -> None:
    """No table holds a block twice, no block serves two groups, and two requests share a block
    only at the same block position (as a prefix hit shares it), but in an align-mode Mamba group with
    prefill checkpoints: there a checkpoint's block holds the state at a hit boundary inside an earlier
    block than its own position, and a later request's hit on that boundary places it at the boundary's
    position.

    Guards: cross-group double allocation (seed 003: one group's external
    allocation popping another group's untouched hit block)."""
    checkpoint_groups = {
        group_id
        for group_id, group in enumerate(check.config.groups)
        if group.rules.aligned_states and group.prefill_checkpoint_alignment is not None
    }
    group_of: dict[int, int] = {}
    position_of: dict[int, tuple[int, str]] = {}
    for request_id, groups in check.sut.tables.items():
        for group_id, table in enumerate(groups):
            held = [b for b in table if b != 0]
            repeated = sorted(b for b, n in Counter(held).items() if n > 1)
            if repeated:
                _fail(
                    check,
                    "no_duplicate_block_ids",
                    f"request {request_id} group {group_id} holds block {repeated[0]} twice: table {list(table)}",
                )
            for position, block_id in enumerate(table):
                if block_id == 0:
                    continue
                other_group = group_of.setdefault(block_id, group_id)
                if other_group != group_id:
                    _fail(
                        check,
                        "no_duplicate_block_ids",
                        f"block {block_id} is held in group {other_group} "
                        f"and in group {group_id} (request {request_id})",
                    )
                other_position, other_request = position_of.setdefault(block_id, (position, request_id))
                if other_position != position and group_id not in checkpoint_groups:
                    _fail(
                        check,
                        "no_duplicate_block_ids",
                        f"block {block_id} is block {other_position} of "
                        f"{other_request} and block {position} of {request_id}: not a shared prefix",
                    )


def ref_cnt_matches_holders(check: StepCheck) -> None:
    """Every block's ref_cnt equals the number of table slots, over all requests and groups, that hold it
    (plus the deferred frees that still hold it).

    Guards: double touch or missed touch of a hit block; a free that drops
    the wrong count (seed 003's ref-count corruption)."""
    holders = Counter(b for groups in check.sut.tables.values() for table in groups for b in table if b != 0)
    holders.update(b for popped in check.sut.deferred_frees for b in popped if b != 0)
    for block_id, ref_cnt in sorted(check.sut.ref_counts.items()):
        if ref_cnt != holders.get(block_id, 0):
            _fail(
                check,
                "ref_cnt_matches_holders",
                f"block {block_id} ref_cnt differs from its holder count",
                holders.get(block_id, 0),
                ref_cnt,
            )


def free_queue_well_formed(check: StepCheck) -> None:
    """The free queue's forward and backward links agree, its count is right, and every block
    is either in it (ref_cnt 0) or held, never both and never neither; the null block is never in it.

    Guards: a linked-list splice that loses or duplicates a node; touch not
    taking a free hit block out of the queue."""
    sut = check.sut
    forward, backward = list(sut.free_order), list(sut.free_order_backward)
    if forward != backward[::-1]:
        _fail(check, "free_queue_well_formed", "forward and backward walks disagree", forward, backward[::-1])
    if len(forward) != sut.num_free:
        _fail(check, "free_queue_well_formed", "num_free differs from the queue length", len(forward), sut.num_free)
    repeated = sorted(b for b, n in Counter(forward).items() if n > 1)
    if repeated:
        _fail(check, "free_queue_well_formed", f"block {repeated[0]} is in the queue twice", None, forward)
    if 0 in forward:
        _fail(check, "free_queue_well_formed", "the null block is in the free queue", None, forward)
    queued = set(forward)
    for block_id, ref_cnt in sorted(sut.ref_counts.items()):
        if (ref_cnt == 0) != (block_id in queued):
            where = "in the free queue" if block_id in queued else "not in the free queue"
            _fail(check, "free_queue_well_formed", f"block {block_id} has ref_cnt {ref_cnt} and is {where}")


def has_partial_keys(config: TargetConfig, group_id: int) -> bool:
    """Whether group ``group_id`` may cache a block under a hash boundary inside it (a partial key): a
    full-attention group with blocks larger than the hashes (the prompt's last boundary), and an
    align-mode Mamba group with blocks larger than the hashes (the state there; with sub-block hits off
    beside a window hashed finer, vLLM 0.33.0 still keys the prompt's last hash boundary)."""
    if config.group_block_size(group_id) == config.hash_size:
        return False
    rules = config.groups[group_id].rules
    return rules.full_hit or rules.aligned_states


def cache_map_consistent(check: StepCheck) -> None:
    """Every prefix-cache entry points to a block whose hash is that key, every hashed block is
    in the map, and every key covers whole blocks (and the lookahead tokens hashes cover).

    Guards: a reused block keeping its stale hash; eviction that clears the
    block but not the map entry (or the reverse)."""
    from_map = {(g, prefix, b) for g, prefix, b in check.sut.cache_entries}
    from_blocks = {(g, prefix, b) for b, keys in check.sut.block_cache_keys.items() for g, prefix in keys}
    if from_map != from_blocks:
        stale = sorted(from_map - from_blocks, key=repr)[:3]
        missing = sorted(from_blocks - from_map, key=repr)[:3]
        _fail(
            check,
            "cache_map_consistent",
            f"map entries without a matching block hash: {stale}; hashed blocks missing from the map: {missing}",
        )
    config = check.config
    lookahead = config.num_hash_lookahead_tokens
    hash_size = config.hash_size
    for group_id, prefix, block_id in sorted(from_map, key=repr):
        covered = len(prefix) - lookahead
        block_size = config.group_block_size(group_id)
        # A partial key (blocks larger than the hashes) ends on a hash boundary.
        partial = has_partial_keys(config, group_id)
        unit = hash_size if partial else block_size
        if covered <= 0 or covered % unit:
            after = f" and the {lookahead} tokens after them" if lookahead else ""
            whole = f"whole {unit}-token {'hashes' if partial else 'blocks'}"
            _fail(
                check,
                "cache_map_consistent",
                f"block {block_id} (group {group_id}) is cached under a {len(prefix)}-token prefix, not {whole}{after}",
            )


def events_match_cache(check: StepCheck) -> None:
    """Replayed from the first step, the KV cache event stream rebuilds exactly the prefix cache's
    entries: each (group, prefix) as many times as blocks are cached under it.  No event removes an
    entry the stream does not hold, and every stored event is well formed: its entries extend its
    parent, one per whole block it covers, over its own tokens.

    Guards: an eviction or reset that is not reported (an external cache or
    router keeps routing to blocks that are gone); a store reported twice or
    never; a store naming the wrong parent or tokens."""
    if not check.config.enable_kv_cache_events:
        return
    events = check.sut.events
    replay = check.event_replay if check.event_replay is not None else EventReplay()
    if not replay.continues(events):
        replay.restart()
    view = replay.view
    try:
        for index in range(len(replay.replayed), len(events)):
            event = events[index]
            if isinstance(event, ClearedEvent):
                view.clear()
            elif isinstance(event, RemovedEvent):
                key = (event.group, event.prefix)
                if view[key] <= 0:
                    _fail(
                        check,
                        "events_match_cache",
                        f"event {index} removes group {event.group} prefix {list(event.prefix)}, which the "
                        "stream does not hold (never stored, or removed already)",
                    )
                view[key] -= 1
            else:
                _check_stored_event(check, index, event)
                view.update((event.group, prefix) for prefix in event.prefixes)
    except InvariantViolation:
        replay.restart()  # the view holds part of the failing step's events: a later check starts over
        raise
    replay.replayed = events
    held = Counter((group, prefix) for group, prefix, _ in check.sut.cache_entries)
    if view != held:  # Counter equality counts a missing entry as 0
        unheld = sorted((view - held).items())[:3]
        unreported = sorted((held - view).items())[:3]
        _fail(
            check,
            "events_match_cache",
            f"the event stream holds (group, prefix) x count {unheld} beyond the cache (stored twice, or a "
            f"removal not reported); the cache holds {unreported} beyond the stream (a store not reported)",
        )


def _check_stored_event(check: StepCheck, index: int, event: StoredEvent) -> None:
    config = check.config
    group_block_size = config.group_block_size(event.group)
    lookahead = config.num_hash_lookahead_tokens

    def bad(detail: str) -> None:
        _fail(check, "events_match_cache", f"stored event {index} (group {event.group}) {detail}")

    # A partial entry's store speaks of the one hash unit ending at its boundary.
    sizes = {group_block_size}
    if has_partial_keys(config, event.group):
        sizes.add(config.hash_size)
    if event.block_size not in sizes:
        bad(f"says blocks of {event.block_size} tokens, not {' or '.join(map(str, sorted(sizes)))}")
    block_size = event.block_size
    if len(event.token_ids) % block_size or not event.token_ids:
        bad(f"covers {len(event.token_ids)} tokens, not a positive number of whole blocks")
    start = 0
    if event.parent is not None:
        if len(event.parent) <= lookahead or (len(event.parent) - lookahead) % block_size:
            bad(f"names a {len(event.parent)}-token parent prefix, not whole blocks")
        start = (len(event.parent) - lookahead) // block_size
    # The tokens the event speaks of: the parent's blocks, then its own.
    tokens = (event.parent or ())[: start * block_size] + event.token_ids
    end = start + len(event.token_ids) // block_size
    if event.parent is not None and tokens[: len(event.parent)] != event.parent[: len(tokens)]:
        bad(f"covers tokens {list(event.token_ids)} that do not follow its parent {list(event.parent)}")
    if (event.lookahead_token_ids is None) != (lookahead == 0):
        bad(f"has lookahead tokens {event.lookahead_token_ids} with hashes looking {lookahead} tokens ahead")
    last = start - 1
    for entry, prefix in enumerate(event.prefixes):
        position = (len(prefix) - lookahead) // block_size - 1
        whole = len(prefix) > lookahead and (len(prefix) - lookahead) % block_size == 0
        if not whole or not last < position < end:
            bad(f"stores a {len(prefix)}-token prefix, not the next whole block among positions {start}..{end - 1}")
        cut = (position + 1) * block_size
        if prefix[:cut] != tokens[:cut] or (event.parent is not None and prefix[: len(event.parent)] != event.parent):
            bad(f"stores prefix {list(prefix)}, which is not its parent and tokens {list(tokens[:cut])}")
        if event.lookahead_token_ids is not None and event.lookahead_token_ids[entry] != prefix[cut:]:
            bad(f"gives lookahead tokens {list(event.lookahead_token_ids[entry])} for prefix {list(prefix)}")
        last = position


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
            _fail(
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
        _fail(
            check,
            invariant,
            f"request {rid} group {group_id} ({kind}) must hold {size} block{'s' * (size != 1)}, none null, while it "
            "holds any",
            size,
            list(table),
        )
    cached = [b for b in table if b in check.sut.block_cache_keys]
    if cached:
        _fail(check, invariant, f"request {rid} group {group_id} ({kind}) has blocks in the prefix cache: {cached}")


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
            _fail(
                check,
                "rswa_keeps_the_prompt",
                f"request {rid} group {group_id} (R-SWA) freed a block of its {prompt_blocks}-block prompt",
                f"blocks at positions 0..{prompt_blocks - 1}",
                list(table),
            )
        if nulls and nulls != list(range(nulls[0], nulls[-1] + 1)):
            _fail(
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
            _fail(
                check,
                "mamba_keeps_a_state_tail",
                f"request {rid} group {group_id} (Mamba, {spec} speculative) must end in {1 + spec} or more blocks, "
                "with null blocks only before them, while it holds any",
                f"null blocks, then {1 + spec} or more blocks",
                list(table),
            )
        cached = [b for b in table if b != 0 and b in check.sut.block_cache_keys]
        if cached:
            _fail(
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
            _fail(
                check,
                "mamba_align_keeps_few_states",
                f"request {rid} group {group_id} (Mamba, align mode): its last step ended after token "
                f"{state_tokens}, so its state is saved at position {state}, which holds no live block",
                f"a live block at position {state}",
                list(table),
            )
        if table[-1] == 0 or len(live) > limit:
            _fail(
                check,
                "mamba_align_keeps_few_states",
                f"request {rid} group {group_id} (Mamba, align mode) must end in a live block and hold at most "
                f"{limit} live blocks, null blocks elsewhere",
                f"at most {limit} live blocks, the last position live",
                list(table),
            )


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
                    _fail(
                        check,
                        "in_flight_blocks_held",
                        f"a step of request {request_id} in flight reads a position of group {group_id} "
                        f"that held no block when it was scheduled (reads {list(blocks)})",
                    )
                if block_id not in held and block_id not in deferred:
                    state = "free" if block_id in check.sut.free_order else "held elsewhere"
                    _fail(
                        check,
                        "in_flight_blocks_held",
                        f"block {block_id} of group {group_id}, read by a step of request {request_id} still "
                        f"in flight, is {state}: neither in the request's table nor in a deferred free",
                    )


def admission_matches_model(check: StepCheck) -> None:
    """allocate_slots refuses (returns None) exactly when the model says the step does not fit.

    Guards: spurious refusals that stall a request; over-admission that runs
    out of blocks half-way (hit blocks sitting free not counted as consumed)."""
    if check.sut_result.admitted != check.model_result.admitted:
        _fail(
            check, "admission_matches_model", "admitted differs", check.model_result.admitted, check.sut_result.admitted
        )


def hit_is_sound_and_maximal(check: StepCheck) -> None:
    """A prefix hit returns only blocks cached under the request's own prefix, is block-aligned,
    stays below the request's last token, and is the longest prefix every group accepts.

    Guards: a hit ignoring its length cap; a sliding-window hit needing too
    few or too many blocks; a hybrid hit one group does not accept."""
    sut, model = check.sut_result, check.model_result
    if not isinstance(check.op, Schedule) or model.hit_length is None:
        return
    if sut.hit_length != model.hit_length:
        _fail(
            check,
            "hit_is_sound_and_maximal",
            f"hit length of {check.op.request_id} differs",
            model.hit_length,
            sut.hit_length,
        )
    if sut.hit_block_ids != model.hit_block_ids:
        _fail(
            check,
            "hit_is_sound_and_maximal",
            f"hit blocks of {check.op.request_id} differ",
            model.hit_block_ids,
            sut.hit_block_ids,
        )


def failed_allocation_changes_nothing(check: StepCheck) -> None:
    """A refused allocate_slots leaves pool, tables, ref counts and cache as before
    (apart from releasing blocks that had already left the attention window).

    Guards: a refused allocation that leaks a popped block or a touched hit."""
    if check.sut_result.admitted is not False:
        return
    for field in ("free_order", "tables", "ref_counts", "cache_entries"):
        expected, actual = getattr(check.model, field), getattr(check.sut, field)
        if expected != actual:
            _fail(
                check, "failed_allocation_changes_nothing", f"{field} changed by a refused allocation", expected, actual
            )


def _same_reuse_order(check: StepCheck, invariant: str) -> None:
    if check.sut_result.new_block_ids != check.model_result.new_block_ids:
        _fail(
            check,
            invariant,
            "newly allocated blocks differ",
            check.model_result.new_block_ids,
            check.sut_result.new_block_ids,
        )
    if check.sut.free_order != check.model.free_order:
        _fail(check, invariant, "free queue order differs", list(check.model.free_order), list(check.sut.free_order))


def lifo_head_reuse_when_caching_off(check: StepCheck) -> None:
    """With caching off, freed blocks go to the head of the queue, so the blocks handed out next
    are the most recently freed ones, in reverse free order.

    Guards: the FIFO/LIFO flip (seed 000: ``hash is None and caching_on``
    written for ``hash is None or not caching_on`` in free_blocks)."""
    if not check.config.enable_caching:
        _same_reuse_order(check, "lifo_head_reuse_when_caching_off")


def lru_eviction_when_caching_on(check: StepCheck) -> None:
    """With caching on, the free queue is: uncached blocks at the head (most recently freed
    first), cached blocks at the tail in least-recently-freed order, each request tail block first.

    Guards: a free that does not reverse a request's blocks; cached blocks
    freed to the head (evicting a hot prefix first)."""
    if check.config.enable_caching:
        _same_reuse_order(check, "lru_eviction_when_caching_on")


def _same_result(check: StepCheck, field: str, invariant: str, detail: str) -> None:
    """The target's ``field`` of the step's result is the model's, or ``invariant`` fails with ``detail``."""
    expected, actual = getattr(check.model_result, field), getattr(check.sut_result, field)
    if actual != expected:
        _fail(check, invariant, detail, expected, actual)


def _same_block_copies(check: StepCheck) -> None:
    _same_result(check, "block_copies", "tables_match_model", "the block copies the step queued differ")


def tables_match_model(check: StepCheck) -> None:
    """Every request's table in every group is the one the model predicts (null blocks included), and
    so are the block copies a step queues (source and destination).

    Guards: a sliding-window or chunked-local skip off by one block; blocks
    not freed at preemption; a copy on write from or into the wrong block."""
    _same_block_copies(check)
    if check.sut.deferred_frees != check.model.deferred_frees:
        _fail(
            check,
            "tables_match_model",
            "the blocks held by deferred frees differ",
            check.model.deferred_frees,
            check.sut.deferred_frees,
        )
    if check.sut.tables != check.model.tables:
        differing = sorted(set(check.sut.tables) ^ set(check.model.tables)) or sorted(
            r for r in check.sut.tables if check.sut.tables[r] != check.model.tables.get(r)
        )
        first = differing[0]
        _fail(
            check,
            "tables_match_model",
            f"table of request {first} differs",
            check.model.tables.get(first),
            check.sut.tables.get(first),
        )


def cache_matches_model(check: StepCheck) -> None:
    """The prefix cache holds exactly the entries the model predicts.

    Guards: a block cached too early (lookahead or unfinished tokens) or
    never; eviction that misses an entry."""
    if check.sut.cache_entries != check.model.cache_entries:
        extra = sorted(check.sut.cache_entries - check.model.cache_entries, key=repr)[:3]
        missing = sorted(check.model.cache_entries - check.sut.cache_entries, key=repr)[:3]
        _fail(check, "cache_matches_model", f"unexpected entries {extra}; missing entries {missing}")


def events_match_model(check: StepCheck) -> None:
    """The KV cache event stream is exactly the one the model predicts: each store with its
    entries, parent and tokens, each removal, each clear, in order.

    Guards: events that replay to the right cache but say the wrong thing on
    the way (a removal reported late, a store split or merged differently)."""
    if not check.config.enable_kv_cache_events or check.sut.events == check.model.events:
        return
    sut, model = check.sut.events, check.model.events
    first = next((i for i, (a, b) in enumerate(zip(sut, model)) if a != b), min(len(sut), len(model)))
    _fail(
        check,
        "events_match_model",
        f"KV cache event {first} differs (the stream has {len(sut)} events, the model {len(model)})",
        model[first] if first < len(model) else None,
        sut[first] if first < len(sut) else None,
    )


def reset_refused_only_while_held(check: StepCheck) -> None:
    """reset_prefix_cache succeeds exactly when no block is held.

    Guards: a reset that drops the hashes of blocks still in use."""
    if check.sut_result.reset_done != check.model_result.reset_done:
        _fail(
            check,
            "reset_refused_only_while_held",
            "reset result differs",
            check.model_result.reset_done,
            check.sut_result.reset_done,
        )


def hit_block_never_written(check: StepCheck) -> None:
    """After a waiting request's admitted step, no group's table holds, at the position where the hit
    ends inside a block, the hit's own block: the request writes its next tokens there, so a block
    shared through the prefix cache must have been replaced by a private copy.

    Guards: a hit that ends inside a larger group's block (aligned to the hash
    size, not the scheduler block size; a partial hit without its copy on
    write), whose cached tokens the request then overwrites (the target's own
    hit and tables, checked without the model)."""
    result = check.sut_result
    hit_length, hit_blocks = result.hit_length, result.hit_block_ids
    if not result.admitted or not hit_length or hit_blocks is None:
        return
    request_id: str = getattr(check.op, "request_id", "")  # an admitted step names its request
    tables = check.sut.tables.get(request_id)
    if tables is None:
        return
    for group_id, (hit, table) in enumerate(zip(hit_blocks, tables)):
        block_size = check.config.group_block_size(group_id)
        position = hit_length // block_size
        inside = hit_length % block_size and position < min(len(hit), len(table)) and hit[position] != 0
        if inside and table[position] == hit[position]:
            _fail(
                check,
                "hit_block_never_written",
                f"request {request_id} group {group_id}: its {hit_length}-token hit ends inside block "
                f"{hit[position]} (position {position}, {block_size}-token blocks), which its table still "
                "holds for the tokens it writes next",
                "a private copy",
                hit[position],
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
            _fail(check, "block_copies_well_formed", f"copy {source} -> {destination} is not between two blocks")
        if source in hit_sources:
            if hit_sources[source] != destination:
                _fail(
                    check,
                    "block_copies_well_formed",
                    f"request {request_id}'s hit block {source} is copied into block {destination}, not the block "
                    "its table holds where the hit ends",
                    hit_sources[source],
                    destination,
                )
            continue
        if source not in held:
            _fail(
                check,
                "block_copies_well_formed",
                f"copy {source} -> {destination} of request {request_id}: the source is neither its hit's shared "
                "block nor a block of its table",
            )
        keys = check.sut.block_cache_keys
        shared_keys = set(keys.get(source, ())) & set(keys.get(destination, ()))
        if destination in held_by_any or shared_keys:
            _fail(
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
    _same_state_offloads(check)


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
            _fail(check, "state_offloads_well_formed", f"{offer} is offered from a group that is not align-mode Mamba")
        if not block_id or num_tokens <= 0 or num_tokens % config.hash_size:
            _fail(
                check,
                "state_offloads_well_formed",
                f"{offer} is offered on the null block or off a hash boundary (hashes of {config.hash_size})",
            )
        copy_keys = check.sut.block_cache_keys.get(sources.get(block_id, 0), ())
        if any(key[0] == group_id and len(key[1]) - lookahead == num_tokens for key in copy_keys):
            _fail(
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
            _fail(
                check,
                "state_offloads_well_formed",
                f"{offer} is offered, but its table in that group does not hold the block (nor a block copied into it)",
                sorted(table),
                block_id,
            )


def _same_state_offloads(check: StepCheck) -> None:
    detail = "the boundary states offered a connector differ from the model's"
    _same_result(check, "state_offloads", "state_offloads_well_formed", detail)


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
    _same_zeroed_blocks(check)


def _zeroed_blocks_fresh_on_the_target(check: StepCheck) -> None:
    result = check.sut_result
    zeroed = result.zeroed_block_ids
    config = check.config
    request_id: str = getattr(check.op, "request_id", "")  # an admitted step names its request
    tables = check.sut.tables.get(request_id, ())
    if not config.needs_zeroing:
        if zeroed:
            detail = "blocks handed over for zeroing by a cache that needs none"
            _fail(check, "zeroed_blocks_are_fresh", detail, (), zeroed)
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
                    _fail(
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
        _fail(
            check,
            "zeroed_blocks_are_fresh",
            f"fresh blocks {sorted(missing)} of request {request_id} are not handed over for zeroing",
            sorted(expected),
            zeroed,
        )
    stale = set(zeroed) - expected
    if stale:
        _fail(
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
            _fail(check, "zeroed_blocks_are_fresh", f"block {block} is handed over for zeroing: {reason}", None, zeroed)


def cached_tokens_probe_changes_nothing(check: StepCheck) -> None:
    """``get_num_cached_tokens``, asked of a waiting request before its lookup (releases with the probe),
    changes no observed state and answers what the model's lookup finds.

    Guards: a probe that touches its hit blocks (a reference taken, a free-queue entry moved), records
    the request's lookup, or queues an event, so that asking whether a request would hit changes what
    the next request hits; a probe that answers other than the lookup that follows it."""
    if check.sut_result.probe_changed:
        detail = "get_num_cached_tokens changed the observed state"
        _fail(check, "cached_tokens_probe_changes_nothing", detail, (), check.sut_result.probe_changed)
    detail = "get_num_cached_tokens answered other than the model's lookup"
    _same_result(check, "probed_tokens", "cached_tokens_probe_changes_nothing", detail)


def _same_zeroed_blocks(check: StepCheck) -> None:
    detail = "the blocks the step hands the worker to zero differ from the model's"
    _same_result(check, "zeroed_block_ids", "zeroed_blocks_are_fresh", detail)


Invariant = Callable[[StepCheck], None]

ALL_INVARIANTS: tuple[Invariant, ...] = (
    no_duplicate_block_ids,
    ref_cnt_matches_holders,
    free_queue_well_formed,
    cache_map_consistent,
    events_match_cache,
    scheduled_slots_have_blocks,
    ring_holds_one_block,
    cross_attention_holds_encoder_blocks,
    rswa_keeps_the_prompt,
    mamba_keeps_a_state_tail,
    mamba_align_keeps_few_states,
    in_flight_blocks_held,
    hit_block_never_written,
    block_copies_well_formed,
    admission_matches_model,
    hit_is_sound_and_maximal,
    cached_tokens_probe_changes_nothing,
    failed_allocation_changes_nothing,
    zeroed_blocks_are_fresh,
    lifo_head_reuse_when_caching_off,
    lru_eviction_when_caching_on,
    tables_match_model,
    cache_matches_model,
    reset_refused_only_while_held,
    events_match_model,
    state_offloads_well_formed,
)


NOT_OBSERVED = Observation((), (), 0, {}, {}, frozenset(), {})
"""The observation of a step whose state is not looked at (see :func:`check_results`)."""


def check_results(
    step: int, op: Operation, config: TargetConfig, sut_result: StepResult, model_result: StepResult
) -> None:
    """The invariants, or their parts, that need only what a step returned, no observation: the
    admission, the hit, the newly allocated blocks (in the reuse-order invariant of the caching mode)
    and the reset's outcome.  The steps between two full checks (:class:`kvcheck.lockstep.Lockstep`
    with ``full_check_every``) run these."""
    check = StepCheck(step, op, config, sut_result, model_result, NOT_OBSERVED, NOT_OBSERVED)
    admission_matches_model(check)
    hit_is_sound_and_maximal(check)
    _same_zeroed_blocks(check)
    _same_block_copies(check)
    if sut_result.new_block_ids != model_result.new_block_ids:
        invariant = "lru_eviction_when_caching_on" if config.enable_caching else "lifo_head_reuse_when_caching_off"
        _fail(check, invariant, "newly allocated blocks differ", model_result.new_block_ids, sut_result.new_block_ids)
    reset_refused_only_while_held(check)
    _same_state_offloads(check)
    cached_tokens_probe_changes_nothing(check)


def check_all(check: StepCheck) -> None:
    """Run every invariant in order; the first violation is raised."""
    for invariant in ALL_INVARIANTS:
        invariant(check)
