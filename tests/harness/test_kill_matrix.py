"""The suite bites: every catalogued fault is killed, and the seed bugs shrink to short repros."""

from __future__ import annotations

import pytest

from kvcheck.faults import FAULTS
from kvcheck.kill_matrix import KillBudget, KillResult, kill, shrunk_trace
from kvcheck.replay import replay, resolve_target

BUDGET = KillBudget()
SEED_FAULT_MAX_STEPS = {"fifo-reuse-when-caching-off": 4, "interleaved-external-alloc": 8}
"""The swarm driver has no warm start: its seed-003 repro builds the warm pool from two requests
(7 steps from the fixed seeds); the manager machine's, from a warm start, is 4 steps."""
MAX_SHRUNK_STEPS = 8
"""Every fault's swarm repro, once shrunk, is at most this long."""


@pytest.fixture(scope="module")
def results() -> dict[str, KillResult]:
    return {name: kill(fault, BUDGET) for name, fault in FAULTS.items()}


@pytest.mark.parametrize("name", list(FAULTS))
def test_every_catalogued_fault_is_killed(name: str, results: dict[str, KillResult]) -> None:
    """Within the fixed budget the driver breaks an invariant with the fault planted."""
    result = results[name]
    assert result.killed, f"{name} survived {len(BUDGET.seeds)} seeds x {BUDGET.runs_per_seed} runs"


@pytest.mark.parametrize("name", list(FAULTS))
def test_every_fault_shrinks_to_at_most_eight_steps(name: str, results: dict[str, KillResult]) -> None:
    result = results[name]
    assert result.shrunk_steps is not None and result.shrunk_steps <= MAX_SHRUNK_STEPS, result


@pytest.mark.parametrize("name", list(SEED_FAULT_MAX_STEPS))
def test_seed_faults_shrink_to_short_repros(name: str, results: dict[str, KillResult]) -> None:
    """The two seed bugs shrink to at most 4 and 8 steps, and the repro fails on replay as reported."""
    result = results[name]
    assert result.shrunk_steps is not None and result.shrunk_steps <= SEED_FAULT_MAX_STEPS[name], result
    trace = shrunk_trace(result)
    assert replay(trace, resolve_target("kvcore")).violation is None
    planted = replay(trace, resolve_target("kvcore", name)).violation
    assert planted is not None and planted.invariant == result.invariant


def test_cross_group_double_allocation_is_caught_by_a_block_invariant(results: dict[str, KillResult]) -> None:
    """The seed-003 fault is killed by no_duplicate_block_ids or ref_cnt_matches_holders."""
    assert results["interleaved-external-alloc"].invariant in ("no_duplicate_block_ids", "ref_cnt_matches_holders")


EVENT_FAULTS = ("evicted-block-removal-unreported", "stored-event-repeats-cached-blocks", "reset-unreported")


@pytest.mark.parametrize("name", EVENT_FAULTS)
def test_event_stream_faults_are_caught_by_an_event_invariant(name: str, results: dict[str, KillResult]) -> None:
    """The KV cache event faults leave the cache itself right: only the event stream's invariants see them."""
    assert results[name].invariant in ("events_match_cache", "events_match_model"), results[name]
