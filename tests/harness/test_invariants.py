"""Every named invariant holds on a consistent step and fires, by name, on a step that breaks it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs
import pytest

from kvcheck.lockstep import Lockstep
from kvcheck.targets import load_target
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.invariants import ALL_INVARIANTS, InvariantViolation, StepCheck, check_all
from kvmodel.observation import ClearedEvent, RemovedEvent
from kvmodel.ops import AddRequest, Finish, Schedule, SpecDecode

CACHING = TargetConfig(
    num_blocks=10,
    block_size=1,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=3)),
    enable_caching=True,
)
EVENTS = attrs.evolve(CACHING, enable_kv_cache_events=True)


def checked_step(config: TargetConfig, ops: list[object]) -> StepCheck:
    """The check of the last of ``ops``, replayed on kvcore (every invariant holds there)."""
    lockstep = Lockstep(load_target("kvcore"), config)
    for op in ops:
        lockstep.step(op)  # type: ignore[arg-type]
    assert lockstep.last is not None
    return lockstep.last


def two_requests_sharing_a_prefix(config: TargetConfig = CACHING) -> StepCheck:
    return checked_step(
        config,
        [
            AddRequest("a", (0, 1, 2)),
            Schedule("a", 3, 0, 0),
            AddRequest("b", (0, 1, 2, 1)),
            Schedule("b", 4, 0, 0),
        ],
    )


def with_sut(check: StepCheck, **changes: object) -> StepCheck:
    return attrs.evolve(check, sut=attrs.evolve(check.sut, **changes))


def table_of(check: StepCheck, request_id: str, group: int, table: tuple[int, ...]) -> StepCheck:
    groups = list(check.sut.tables[request_id])
    groups[group] = table
    return with_sut(check, tables={**check.sut.tables, request_id: tuple(groups)})


def grown_by_a_free_block(check: StepCheck, request_id: str, group: int) -> StepCheck:
    """The request's table in ``group`` holds the head of the free queue too, every count kept consistent."""
    taken, *rest = check.sut.free_order
    check = with_sut(
        check,
        free_order=tuple(rest),
        free_order_backward=tuple(rest[::-1]),
        num_free=len(rest),
        ref_counts={**check.sut.ref_counts, taken: 1},
    )
    return table_of(check, request_id, group, (*check.sut.tables[request_id][group], taken))


def block_freed(check: StepCheck, request_id: str, group: int, position: int) -> StepCheck:
    """The request's table in ``group`` with the null block at ``position``, whose block went back to
    the free queue's tail, every count kept consistent."""
    table = check.sut.tables[request_id][group]
    freed = table[position]
    kept = (*table[:position], 0, *table[position + 1 :])
    ref_counts = {block: count for block, count in check.sut.ref_counts.items() if block != freed}
    free_order = (*check.sut.free_order, freed)
    check = with_sut(
        check,
        free_order=free_order,
        free_order_backward=free_order[::-1],
        num_free=len(free_order),
        ref_counts=ref_counts,
    )
    return table_of(check, request_id, group, tuple(kept))


def breakages() -> dict[str, Callable[[], StepCheck]]:
    """For each invariant, a step that breaks it and nothing checked before it."""
    base = two_requests_sharing_a_prefix
    caching_off = TargetConfig(num_blocks=6, block_size=1, groups=(GroupSpec(kind="full"),), enable_caching=False)

    def duplicate() -> StepCheck:
        check = base()
        table = check.sut.tables["a"][0]
        return table_of(check, "a", 0, (table[0], *table))

    def wrong_ref_cnt() -> StepCheck:
        check = base()
        block = check.sut.tables["a"][0][0]
        return with_sut(check, ref_counts={**check.sut.ref_counts, block: check.sut.ref_counts[block] + 1})

    def torn_queue() -> StepCheck:
        check = base()
        return with_sut(check, free_order_backward=(*check.sut.free_order_backward, check.sut.free_order[0]))

    def stale_map_entry() -> StepCheck:
        check = base()
        held = check.sut.tables["a"][0][0]
        return with_sut(check, cache_entries=check.sut.cache_entries | {(0, (2, 2), held)})

    def spurious_refusal() -> StepCheck:
        check = base()
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, admitted=False))

    def short_hit() -> StepCheck:
        check = base()
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, hit_length=0))

    def probe_touching_its_hit() -> StepCheck:
        # b's probe before its lookup took a reference on its hit blocks (reported by the target).
        check = base()
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, probe_changed=("ref_counts",)))

    def leaky_refusal() -> StepCheck:
        check = checked_step(
            TargetConfig(num_blocks=4, block_size=1, groups=(GroupSpec(kind="full"),), enable_caching=True),
            [AddRequest("a", (0,) * 8), Schedule("a", 8, 0, 0)],
        )
        assert check.sut_result.admitted is False
        # The refused request kept a block: consistent in itself, but not what the model says.
        leaked, *rest = check.sut.free_order
        return with_sut(
            check,
            free_order=tuple(rest),
            free_order_backward=tuple(rest[::-1]),
            num_free=len(rest),
            ref_counts={**check.sut.ref_counts, leaked: 1},
            tables={"a": ((leaked,),)},
        )

    def fifo() -> StepCheck:
        check = checked_step(caching_off, [AddRequest("a", (0, 1)), Schedule("a", 2, 0, 0), Finish("a")])
        order = check.sut.free_order
        return with_sut(
            check, free_order=(*order[2:], *order[:2]), free_order_backward=(*order[:2][::-1], *order[2:][::-1])
        )

    def head_first_lru() -> StepCheck:
        check = checked_step(CACHING, [AddRequest("a", (0, 1, 2)), Schedule("a", 3, 0, 0), Finish("a")])
        order = check.sut.free_order
        return with_sut(check, free_order=order[::-1], free_order_backward=order)

    def wrong_table() -> StepCheck:
        check = checked_step(CACHING, [AddRequest("a", (0, 1, 2)), Schedule("a", 3, 0, 0)])
        first, second, third = check.sut.tables["a"][0]
        return table_of(check, "a", 0, (first, third, second))

    def extra_cache_entry() -> StepCheck:
        check = base()
        free_block = check.sut.free_order[0]
        entry = (0, (2, 2, 2), free_block)
        return with_sut(
            check,
            cache_entries=check.sut.cache_entries | {entry},
            block_cache_keys={**check.sut.block_cache_keys, free_block: ((0, (2, 2, 2)),)},
        )

    def slots_without_blocks() -> StepCheck:
        check = base()
        return attrs.evolve(
            check, sut_result=attrs.evolve(check.sut_result, num_slots=(check.sut_result.num_slots or 0) + 1)
        )

    def in_flight_block_freed() -> StepCheck:
        check = checked_step(
            attrs.evolve(CACHING, async_scheduling=True), [AddRequest("a", (0, 1, 2)), Schedule("a", 3, 0, 0)]
        )
        ((request_id, reads),) = check.sut.in_flight_reads
        assert request_id == "a" and reads[0] == check.sut.tables["a"][0]
        # The step in flight reads a block that went back to the free queue.
        return with_sut(check, in_flight_reads=(("a", ((check.sut.free_order[0], *reads[0][1:]), reads[1])),))

    def reset_done_while_held() -> StepCheck:
        check = base()
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, reset_done=True))

    def store_unreported() -> StepCheck:
        check = base(EVENTS)
        return with_sut(check, events=check.sut.events[:-1])

    def store_split_in_two() -> StepCheck:
        # The same entries, told as two events: the replay is right, the stream is not the model's.
        check = base(EVENTS)
        first, *rest = check.sut.events
        head = attrs.evolve(first, prefixes=first.prefixes[:1], token_ids=first.token_ids[:1])
        tail = attrs.evolve(first, prefixes=first.prefixes[1:], parent=first.prefixes[0], token_ids=first.token_ids[1:])
        return with_sut(check, events=(head, tail, *rest))

    def second_ring_block() -> StepCheck:
        config = TargetConfig(
            num_blocks=8, block_size=1, groups=(GroupSpec(kind="full"), GroupSpec(kind="ring")), enable_caching=False
        )
        check = checked_step(config, [AddRequest("a", (0, 1, 2)), Schedule("a", 3, 0, 0)])
        assert len(check.sut.tables["a"][1]) == 1
        return grown_by_a_free_block(check, "a", 1)

    def extra_encoder_block() -> StepCheck:
        config = TargetConfig(
            num_blocks=8,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="cross_attention")),
            enable_caching=False,
            num_encoder_tokens=3,
        )
        check = checked_step(config, [AddRequest("a", (0, 1, 2)), Schedule("a", 3, 0, 0)])
        assert len(check.sut.tables["a"][1]) == 2
        return grown_by_a_free_block(check, "a", 1)

    def gap_inside_the_prompt() -> StepCheck:
        config = TargetConfig(
            num_blocks=12, block_size=1, groups=(GroupSpec(kind="rswa", window=1),), enable_caching=False
        )
        decode = [Schedule("a", 1, 0, 0)] * 3
        check = checked_step(config, [AddRequest("a", (0, 1, 2)), Schedule("a", 3, 0, 0), *decode])
        table = check.sut.tables["a"][0]
        assert table[3] == 0 and 0 not in table[:3]
        # The same blocks, but the freed position is the prompt's last one.
        return table_of(check, "a", 0, (table[0], table[1], 0, table[2], *table[4:]))

    def state_block_freed_inside() -> StepCheck:
        config = TargetConfig(
            num_blocks=8,
            block_size=1,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba", speculative_blocks=1)),
            enable_caching=False,
        )
        check = checked_step(config, [AddRequest("a", (0, 1, 2)), Schedule("a", 3, 0, 0)])
        assert len(check.sut.tables["a"][1]) == 4 and 0 not in check.sut.tables["a"][1]
        return block_freed(check, "a", 1, 1)

    def padding_given_blocks() -> StepCheck:
        config = TargetConfig(
            num_blocks=12,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
            enable_caching=True,
        )
        check = checked_step(config, [AddRequest("a", tuple(range(9))), Schedule("a", 8, 0, 0)])
        table = check.sut.tables["a"][1]
        assert table[:3] == (0, 0, 0) and table[3] != 0
        # Two positions before the state get blocks of their own, as an attention group's would.
        first, second, *rest = check.sut.free_order
        check = with_sut(
            check,
            free_order=tuple(rest),
            free_order_backward=tuple(rest[::-1]),
            num_free=len(rest),
            ref_counts={**check.sut.ref_counts, first: 1, second: 1},
        )
        return table_of(check, "a", 1, (first, second, 0, table[3]))

    def hit_ending_inside_a_block() -> StepCheck:
        # Full attention in 4-token blocks beside a window in 2-token blocks: b's 8-token hit, reported
        # as 6 tokens, ends inside the block of tokens 5-8, which b's table keeps.
        config = TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full", block_size=4), GroupSpec(kind="sliding_window", window=4)),
            enable_caching=True,
        )
        check = checked_step(
            config,
            [
                AddRequest("a", tuple(range(1, 9))),
                Schedule("a", 8, 0, 0),
                AddRequest("b", (*range(1, 9), 9)),
                Schedule("b", 9, 0, 0),
            ],
        )
        assert check.sut_result.hit_length == 8
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, hit_length=6))

    def copy_into_another_block() -> StepCheck:
        # Full attention in 2-token blocks beside Mamba states in 4-token blocks, hashed every 2 tokens:
        # b's 6-token hit ends inside the state block 7, copied into block 6, which b's table holds;
        # reported as copied into block 8 instead.
        config = TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
            enable_caching=True,
        )
        prompt = (1, 2, 3, 4, 5, 6, 7)
        check = checked_step(
            config,
            [
                AddRequest("a", prompt),
                *[Schedule("a", 7, 0, 0)] * 3,
                Finish("a"),
                AddRequest("b", (*prompt[:6], 9, 9, 9)),
                Schedule("b", 9, 0, 0),
            ],
        )
        assert check.sut_result.block_copies == ((7, 6),)
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, block_copies=((7, 8),)))

    def state_offered_from_the_copied_block() -> StepCheck:
        # a caches its state after 6 tokens inside Mamba's 4-token block 5; its third step copies block 5
        # into block 7 for the cache and offers block 7; reported as offering block 5, which a goes on
        # writing.
        config = TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
            enable_caching=True,
        )
        check = checked_step(config, [AddRequest("a", (1, 2, 3, 4, 5, 6, 7)), *[Schedule("a", 7, 0, 0)] * 3])
        assert check.sut_result.block_copies == ((5, 7),)
        assert check.sut_result.state_offloads == (("a", 1, 7, 6),)
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, state_offloads=(("a", 1, 5, 6),)))

    def zeroing_a_hit_block() -> StepCheck:
        check = sub_block_hit_step()
        assert check.sut_result.zeroed_block_ids == (5,)
        return attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, zeroed_block_ids=(5, 4)))

    return {
        "no_duplicate_block_ids": duplicate,
        "ref_cnt_matches_holders": wrong_ref_cnt,
        "free_queue_well_formed": torn_queue,
        "cache_map_consistent": stale_map_entry,
        "events_match_cache": store_unreported,
        "scheduled_slots_have_blocks": slots_without_blocks,
        "ring_holds_one_block": second_ring_block,
        "cross_attention_holds_encoder_blocks": extra_encoder_block,
        "rswa_keeps_the_prompt": gap_inside_the_prompt,
        "mamba_keeps_a_state_tail": state_block_freed_inside,
        "mamba_align_keeps_few_states": padding_given_blocks,
        "in_flight_blocks_held": in_flight_block_freed,
        "hit_block_never_written": hit_ending_inside_a_block,
        "block_copies_well_formed": copy_into_another_block,
        "state_offloads_well_formed": state_offered_from_the_copied_block,
        "zeroed_blocks_are_fresh": zeroing_a_hit_block,
        "admission_matches_model": spurious_refusal,
        "hit_is_sound_and_maximal": short_hit,
        "cached_tokens_probe_changes_nothing": probe_touching_its_hit,
        "failed_allocation_changes_nothing": leaky_refusal,
        "lifo_head_reuse_when_caching_off": fifo,
        "lru_eviction_when_caching_on": head_first_lru,
        "tables_match_model": wrong_table,
        "cache_matches_model": extra_cache_entry,
        "events_match_model": store_split_in_two,
        "reset_refused_only_while_held": reset_done_while_held,
    }


BREAKAGES = breakages()


def sub_block_hit_step(finish_first: bool = True) -> StepCheck:
    """Full attention in 2-token blocks beside Mamba states in 4-token blocks, hashed every 2 tokens (a
    Mamba group: the cache needs zeroing): a computes 7 tokens, then b's 6-token hit (full attention's
    blocks 1, 2, 4; state block 7, copied into block 6) takes new block 5 for full attention, the one
    block handed over for zeroing.  With ``finish_first`` false, a still holds its blocks."""
    config = TargetConfig(
        num_blocks=16,
        block_size=2,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
        enable_caching=True,
    )
    prompt = (1, 2, 3, 4, 5, 6, 7)
    return checked_step(
        config,
        [
            AddRequest("a", prompt),
            *[Schedule("a", 7, 0, 0)] * 3,
            *([Finish("a")] if finish_first else []),
            AddRequest("b", (*prompt[:6], 9, 9, 9)),
            Schedule("b", 9, 0, 0),
        ],
    )


def test_every_invariant_has_a_breaking_step() -> None:
    """The table of breakages covers every invariant in ALL_INVARIANTS."""
    assert set(BREAKAGES) == {invariant.__name__ for invariant in ALL_INVARIANTS}


def test_a_consistent_step_keeps_every_invariant() -> None:
    """On a step replayed from kvcore every invariant holds."""
    check_all(two_requests_sharing_a_prefix())


def states_after_rejected_drafts() -> StepCheck:
    """One align-mode Mamba group in 1-token blocks: a's speculative steps of 3 drafts (2 accepted), then 1
    (none accepted), then 1 (accepted).  Each step's table ends where its drafts end; the allocator frees a
    recorded state only once the processed tokens pass it, so three states wait."""
    config = TargetConfig(num_blocks=8, block_size=1, groups=(GroupSpec(kind="mamba_align"),), enable_caching=True)
    ops = [AddRequest("a", (0,)), Schedule("a", 1, 0, 0), SpecDecode("a", 3, 2, 0)]
    return checked_step(config, [*ops, SpecDecode("a", 1, 0, 0), SpecDecode("a", 1, 1, 0)])


def test_the_states_of_several_steps_wait_after_rejected_drafts() -> None:
    """mamba_align_keeps_few_states allows one more live state per block the most drafts span: without
    that allowance the same table breaks it."""
    check = states_after_rejected_drafts()
    table = check.sut.tables["a"][0]
    assert table[:4] == (0, 0, 0, 0) and 0 not in table[4:] and len(table) == 7
    assert check.sut.draft_tokens == {"a": 3} and check.sut.state_tokens == {"a": 7}
    check_all(check)
    with pytest.raises(InvariantViolation) as caught:
        check_all(with_sut(check, draft_tokens={}))
    assert caught.value.invariant == "mamba_align_keeps_few_states", str(caught.value)
    assert "at most 2 live blocks" in str(caught.value)


def test_a_state_saved_in_the_null_padding_breaks_mamba_align_keeps_few_states() -> None:
    """A last step ending after token 4, whose state goes to position 3, the null padding before the
    drafts' blocks, is reported by name."""
    check = with_sut(states_after_rejected_drafts(), state_tokens={"a": 4})
    with pytest.raises(InvariantViolation) as caught:
        check_all(check)
    assert caught.value.invariant == "mamba_align_keeps_few_states", str(caught.value)
    assert "saved at position 3, which holds no live block" in str(caught.value)


@pytest.mark.parametrize("name", list(BREAKAGES))
def test_the_invariant_fires_by_name_on_a_step_that_breaks_it(name: str) -> None:
    """check_all reports exactly the broken invariant, with the step number."""
    check = BREAKAGES[name]()
    with pytest.raises(InvariantViolation) as caught:
        check_all(check)
    assert caught.value.invariant == name, str(caught.value)
    assert caught.value.step == check.step
    assert name in str(caught.value)


@pytest.mark.parametrize(
    ("finish_first", "zeroed", "reason"),
    [
        (True, (5, 4), "a block of the step's hit"),
        (True, (5, 7), "the source of a block copy"),
        (True, (6, 5), "not in a zeroed group"),
        (True, (), "fresh blocks [5]"),
        (False, (5, 3), "held by another request"),
    ],
    ids=["hit block", "copy source", "Mamba state copy", "new block left out", "another request's block"],
)
def test_zeroing_a_block_with_data_or_missing_a_fresh_one_fails_by_name(
    finish_first: bool, zeroed: tuple[int, ...], reason: str
) -> None:
    """Each way of handing the worker the wrong blocks to zero fails zeroed_blocks_are_fresh, saying why."""
    check = sub_block_hit_step(finish_first)
    assert check.sut_result.zeroed_block_ids == check.model_result.zeroed_block_ids
    with pytest.raises(InvariantViolation) as caught:
        check_all(attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, zeroed_block_ids=zeroed)))
    assert caught.value.invariant == "zeroed_blocks_are_fresh", str(caught.value)
    assert reason in caught.value.detail


def test_a_cache_that_needs_no_zeroing_hands_over_no_block() -> None:
    """One dtype and no Mamba group: no block is zeroed, and one handed over fails by name."""
    check = two_requests_sharing_a_prefix()
    assert not check.config.needs_zeroing and check.sut_result.zeroed_block_ids == ()
    block = check.sut.tables["b"][0][-1]
    with pytest.raises(InvariantViolation) as caught:
        check_all(attrs.evolve(check, sut_result=attrs.evolve(check.sut_result, zeroed_block_ids=(block,))))
    assert caught.value.invariant == "zeroed_blocks_are_fresh"
    assert "needs none" in caught.value.detail


def broken_event_streams() -> dict[str, tuple[object, ...]]:
    """Event streams of the shared-prefix step, each wrong in one way the replay must see."""
    events = two_requests_sharing_a_prefix(EVENTS).sut.events
    first, second, third, fourth = events
    return {
        "a store reported twice": (*events, third),
        "a removal of what was never stored": (*events, RemovedEvent(0, (2, 2))),
        "a removal not reported, the entry stored again": (*events, first),
        "a clear not followed by stores": (*events, ClearedEvent()),
        "a store under the wrong parent": (first, second, attrs.evolve(third, parent=(0, 1)), fourth),
        "a store whose tokens are not its prefix's": (first, second, attrs.evolve(third, token_ids=(2,)), fourth),
        "a store of a block before its parent": (first, second, attrs.evolve(third, prefixes=((0, 1),)), fourth),
        "a store of blocks of another size": (attrs.evolve(first, block_size=3), second, third, fourth),
        "lookahead tokens without lookahead hashes": (
            attrs.evolve(first, lookahead_token_ids=((1,), (2,), (1,))),
            second,
            third,
            fourth,
        ),
    }


@pytest.mark.parametrize("carried", [True, False], ids=["replay carried from the run", "replay from the start"])
@pytest.mark.parametrize("wrong", list(broken_event_streams()))
def test_a_wrong_event_stream_fails_events_match_cache(wrong: str, carried: bool) -> None:
    """The stream replayed from the start must rebuild the cache's entries, and each store must be well
    formed: each way of breaking it fails events_match_cache, before any other invariant; the same
    with the replay the run carried to that step (which holds the right stream: a wrong event among
    those it replayed sends it back to the start)."""
    check = with_sut(two_requests_sharing_a_prefix(EVENTS), events=broken_event_streams()[wrong])
    assert check.event_replay is not None and len(check.event_replay.replayed) == 4
    if not carried:
        check = attrs.evolve(check, event_replay=None)
    with pytest.raises(InvariantViolation) as caught:
        check_all(check)
    assert caught.value.invariant == "events_match_cache", str(caught.value)


def test_the_event_replay_carried_by_a_run_takes_each_event_once() -> None:
    """After each full check the run's replay holds the whole stream and the cache's entries; a view
    emptied behind its back is not rebuilt from the stream: the next check fails on it."""
    check = two_requests_sharing_a_prefix(EVENTS)
    replay = check.event_replay
    assert replay is not None and replay.replayed == check.sut.events
    assert +replay.view == Counter((group, prefix) for group, prefix, _ in check.sut.cache_entries)
    replay.view.clear()
    with pytest.raises(InvariantViolation) as caught:
        check_all(check)
    assert caught.value.invariant == "events_match_cache"


def test_events_are_not_checked_when_the_configuration_has_none() -> None:
    """Without enable_kv_cache_events an empty stream is right, and both event invariants hold."""
    check = two_requests_sharing_a_prefix()
    assert check.sut.events == () == check.model.events
    check_all(check)


def checkpoint_hit_at_its_boundary(checkpoint_alignment: int | None) -> StepCheck:
    """Full attention in 4-token blocks beside Mamba states in 2-token blocks, hashed every 2 tokens: a's
    11-token prefill keeps its checkpoint (the state after 8 tokens) at position 4, the block before its
    last state's; b, sharing 8 tokens while a still runs, hits it and holds it at position 3, the
    8-token boundary's.  ``checkpoint_alignment`` is the Mamba group's prefill checkpoint alignment."""
    groups = (GroupSpec(kind="full", block_size=4), GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1))
    config = TargetConfig(num_blocks=32, block_size=2, groups=groups, enable_caching=True, hash_block_size=2)
    check = checked_step(
        config,
        [
            AddRequest("a", tuple(range(11))),
            Schedule("a", 11, 0, 0),
            AddRequest("b", (*range(8), 50, 51, 52)),
            Schedule("b", 3, 0, 0),
        ],
    )
    assert check.sut.tables["a"][1][4] == check.sut.tables["b"][1][3] != 0
    mamba = attrs.evolve(groups[1], prefill_checkpoint_alignment=checkpoint_alignment)
    return attrs.evolve(check, config=attrs.evolve(config, groups=(groups[0], mamba)))


def test_a_checkpoint_block_is_shared_at_its_boundarys_position() -> None:
    """Two requests may hold a prefill checkpoint's block at different positions (its own, and the
    position of the boundary a hit found it under); a Mamba group without checkpoints may not."""
    check_all(checkpoint_hit_at_its_boundary(1))
    with pytest.raises(InvariantViolation) as caught:
        check_all(checkpoint_hit_at_its_boundary(None))
    assert caught.value.invariant == "no_duplicate_block_ids"
    assert "block 4 of a and block 3 of b: not a shared prefix" in caught.value.detail
